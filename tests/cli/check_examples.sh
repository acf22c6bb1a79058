#!/usr/bin/env bash
# tests/cli/check_examples.sh LOCKSTEP EXAMPLES_DIR WORK_DIR — every examples/*.toml is a
# configuration the real parser accepts (`lockstep train FILE --check`: every section, key, type and
# range checked), and says what its comments say: the default example is the built-in default job,
# each precision example selects its mode. A misspelled key and a value out of range in a copy of
# an example must fail with a message naming them. Nothing may run: --check creates no run folder.
# Every check prints "ok: ..." or "FAIL ..."; the script exits 1 when any check failed.
set -u
bin=$1
examples=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
cd "$work" || exit 1
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# value FILE SECTION KEY: the value of SECTION.KEY in a resolved configuration (what --check
# prints: "key = value  # help"), without its comment.
value() {
  awk -v section="[$2]" -v key="$3" '
    $1 == section { on = 1; next }
    /^\[/ { on = 0 }
    on && $1 == key { sub(/^[^=]*= /, ""); sub(/ +# .*$/, ""); print; exit }' "$1"
}

# expect FILE SECTION KEY VALUE
expect() {
  local got
  got=$(value "$1" "$2" "$3")
  if [[ $got == "$4" ]]; then echo "ok: $2.$3 = $4 in $1"; else fail "$2.$3 is '$got', expected '$4' in $1"; fi
}

"$bin" train --check > defaults.toml || fail "lockstep train --check (no file) exited $?"
count=0
for f in "$examples"/*.toml; do
  [[ -e $f ]] || break
  count=$((count + 1))
  name=$(basename "$f" .toml)
  if "$bin" train "$f" --check > "$name.resolved.toml" 2> "$name.err"; then
    echo "ok: $f accepted"
  else
    fail "$f rejected:"
    sed 's/^/    /' "$name.err"
    continue
  fi
  # The printed configuration reads back as itself.
  "$bin" train "$name.resolved.toml" --check > "$name.again.toml" 2>&1 &&
    cmp -s "$name.resolved.toml" "$name.again.toml" ||
    fail "$name: the resolved configuration does not read back as itself"
done
[[ $count -ge 5 ]] || fail "found $count examples in $examples, expected at least 5"

# What the examples' comments promise.
if cmp -s defaults.toml default.resolved.toml; then
  echo "ok: examples/default.toml is the built-in default job"
else
  fail "examples/default.toml differs from the built-in default job:"
  diff defaults.toml default.resolved.toml | sed 's/^/    /'
fi
expect fp8.resolved.toml model precision '"fp8"'
expect bf16.resolved.toml model precision '"bf16"'
expect fp8-rollout-tis.resolved.toml model precision '"fp8-rollout"'
expect fp8-rollout-tis.resolved.toml loss tis_cap 2.0
expect gsm8k-smollm2.resolved.toml model path '"models/smollm2-135m-instruct"'
expect gsm8k-smollm2.resolved.toml data train '"../shared/data/gsm8k/train.jsonl"'
expect gsm8k-smollm2.resolved.toml sft steps 0
expect word-problems-smollm2.resolved.toml data train '"word-problems"'
expect word-problems-smollm2.resolved.toml optim lr 1e-05
for m in fp8 bf16 fp8-rollout-tis; do expect $m.resolved.toml run out_dir "\"runs/$m\""; done

# A misspelled key and a value out of range are errors that name them.
sed 's/^tis_cap = /tis_capp = /' "$examples/fp8-rollout-tis.toml" > misspelled.toml
out=$("$bin" train misspelled.toml --check 2>&1)
rc=$?
if [[ $rc == 1 && $out == *"misspelled.toml:"* && $out == *"did you mean loss.tis_cap"* ]]; then
  echo "ok: a misspelled key is an error naming the file, its line and the key meant"
else
  fail "misspelled key: exit $rc, output: $out"
fi
sed 's/^precision = "bf16"/precision = "fp16"/' "$examples/bf16.toml" > bad_value.toml
out=$("$bin" train bad_value.toml --check 2>&1)
rc=$?
if [[ $rc == 1 && $out == *"model.precision"* && $out == *"fp16"* ]]; then
  echo "ok: a value that is not allowed is an error naming the key and the value"
else
  fail "bad value: exit $rc, output: $out"
fi

[[ ! -e runs ]] || fail "--check created $work/runs: it must not run anything"
if ((failures)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
