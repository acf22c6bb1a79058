#!/usr/bin/env bash
# tests/cli/expect_output.sh CODE REGEX COMMAND... — a smoke test of a command that checks its exit
# status as well as its output. CTest's PASS_REGULAR_EXPRESSION alone ignores the exit status, so a
# crash after the expected line was printed passed; the smoke tests run through this instead.
# Passes (exit 0) when COMMAND exits with CODE and its output (stdout and stderr together) matches
# the extended regular expression REGEX (bash's =~, where '.' also matches a newline).
set -u
code=$1
regex=$2
shift 2
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [[ $rc != "$code" ]]; then
  echo "FAIL: exit status $rc, expected $code: $*"
  exit 1
fi
if ! [[ $out =~ $regex ]]; then
  echo "FAIL: the output does not match '$regex': $*"
  exit 1
fi
echo "ok: exit status $rc, output matching '$regex'"
