#!/usr/bin/env bash
# Compares the compiled kernels of two CUDA objects or binaries (before / after a change): for each
# kernel whose name matches REGEX, its registers, spills and whether its SASS is the same
# instruction for instruction (addresses and comments aside). The decode kernels' speed moved by
# 1–2% with source changes that did not touch their main loops (H200, 2026-11-22):
# check that a change leaves the kernels it does not mean to change compiled exactly as before.
#   scripts/dev/sass_diff.sh [--rename SED] BEFORE.o AFTER.o [REGEX]   e.g. ... attention.cu.o attention.cu.o decode_kernel
# Kernels are paired by name; when REGEX matches one kernel in each file, those two are compared
# whatever their names (e.g. 'decode_kernelILi128E' after a template parameter was added). With
# --rename, the sed -E expression SED turns BEFORE's names into AFTER's for the pairing, e.g. after
# a defaulted bool template parameter was appended to decode_kernel<int, bool, bool>:
#   --rename 's/(decode_kernelILi[0-9]+(ELb[01]){2}E)EEv/\1Lb0EEEv/'
# cuobjdump and nvdisasm come from NVIDIA's PyPI wheels, into .deps/cuda-tools (git-ignored), when
# the CUDA toolkit here lacks them.
set -euo pipefail
rename='s/^//'
[[ ${1:-} == --rename ]] && { rename=${2:?sass_diff: --rename needs a sed expression}; shift 2; }
[[ $# -ge 2 ]] || { sed -n 2,12p "$0"; exit 2; }
before=$1 after=$2 regex=${3:-.}
for f in "$before" "$after"; do [[ -f $f ]] || { echo "sass_diff: no such file: $f" >&2; exit 2; }; done

tools="$(cd "$(dirname "$0")/../.." && pwd)/.deps/cuda-tools"
find_tool() {
  command -v "$1" 2>/dev/null && return
  for path in "$tools/bin/$1" "/usr/local/cuda/bin/$1"; do [[ -x $path ]] && { echo "$path"; return; }; done
  return 0
}
if [[ -z "$(find_tool cuobjdump)" || -z "$(find_tool nvdisasm)" ]]; then
  echo "sass_diff: installing cuobjdump and nvdisasm from PyPI into $tools" >&2
  wheels=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$wheels" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
  mkdir -p "$tools/bin"
  for w in "$wheels"/*.whl; do
    python3 -c 'import os, sys, zipfile
z, out = zipfile.ZipFile(sys.argv[1]), sys.argv[2]
for n in z.namelist():
    if "/bin/" in n and not n.endswith("/"):
        path = os.path.join(out, os.path.basename(n))
        with open(path, "wb") as f: f.write(z.read(n))
        os.chmod(path, 0o755)' "$w" "$tools/bin"
  done
  rm -rf "$wheels"
fi
cuobjdump=$(find_tool cuobjdump)
export PATH="$(dirname "$(find_tool nvdisasm)"):$PATH"

# Kernel names without the per-file hash of anonymous namespaces.
normalize() { sed -E 's/[0-9]+_GLOBAL__N__[0-9a-f]+_[0-9]+_[A-Za-z0-9_]+_[0-9a-f]{8}/_ANON_/g'; }
# "name REG:n STACK:n LOCAL:n" per kernel.
usage() { "$cuobjdump" --dump-resource-usage "$1" | normalize |
  awk '/Function /{name=$2; sub(/:$/, "", name)} /REG:/{print name, $1, $2, $4}' | grep -E "$regex" | sort; }
# One kernel's instructions, without addresses, encodings and comments.
sass() { "$cuobjdump" -sass "$1" | normalize | awk -v k="$2" '
  /Function : /{on = ($3 == k)} on && /^ +\/\*[0-9a-f]+\*\//{sub(/^ +\/\*[0-9a-f]+\*\/ +/, ""); sub(/ *;.*/, ""); print}'; }

compare() {  # compare BEFORE_KERNEL AFTER_KERNEL, their usage fields after them
  local same="SASS DIFFERS"
  cmp -s <(sass "$before" "$1") <(sass "$after" "$2") && same="same SASS"
  local names=$1
  [[ $1 == "$2" ]] || names="$1 / $2"
  printf '%-12s %s %s %s -> %s %s %s  %s\n' "$same" "$3" "$4" "$5" "$6" "$7" "$8" "$names"
}
if [[ $(usage "$before" | wc -l) == 1 && $(usage "$after" | wc -l) == 1 ]]; then
  # One kernel each: compared whatever their names (a template parameter added, say).
  read -r n1 r1 s1 l1 < <(usage "$before")
  read -r n2 r2 s2 l2 < <(usage "$after")
  compare "$n1" "$n2" "$r1" "$s1" "$l1" "$r2" "$s2" "$l2"
  exit 0
fi
# BEFORE's kernels as "name-after-rename name REG STACK LOCAL".
keyed_before() { usage "$before" | while read -r n r s l; do echo "$(sed -E "$rename" <<<"$n") $n $r $s $l"; done | sort; }
join -v1 <(keyed_before) <(usage "$after") | cut -d' ' -f2- | sed 's/^/only before: /'
join -v2 <(keyed_before) <(usage "$after") | sed 's/^/only after:  /'
join <(keyed_before) <(usage "$after") | while read -r key name r1 s1 l1 r2 s2 l2; do
  compare "$name" "$key" "$r1" "$s1" "$l1" "$r2" "$s2" "$l2"
done
