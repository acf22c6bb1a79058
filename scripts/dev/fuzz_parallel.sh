#!/usr/bin/env bash
# Every libFuzzer harness of tests/fuzz as many processes at once as JOBS says, for machines with
# many cores (the lent GPU machines' CPUs, beside their GPU work); scripts/fuzz.sh runs them one
# after the other. Each process fuzzes its own copy of the harness's corpus with its own -seed.
#   JOBS="safetensors:3 jinja:2 ..." bash scripts/dev/fuzz_parallel.sh start SECONDS [FUZZ_DIR [WORK_DIR]]
#   bash scripts/dev/fuzz_parallel.sh collect [WORK_DIR [REPORT]]   (waits up to MAX_WAIT seconds)
# FUZZ_DIR: the harnesses, seeds/ and corpus/ (default build-fuzz/tests/fuzz); WORK_DIR (default
# /tmp/fz): corpora, logs/ and artifacts/. collect prints per harness the processes, the executions
# summed over them and what was found (a sanitizer report, a crash, a timeout or a leak), and keeps
# the findings' logs and inputs in WORK_DIR. The harnesses read their fixtures at the path they
# were built with (LOCKSTEP_TEST_DATA: the repository's tests/data).
set -u
cmd=${1:?usage: fuzz_parallel.sh start SECONDS [FUZZ_DIR [WORK_DIR]] | collect [WORK_DIR [REPORT]]}
if [ "$cmd" = collect ]; then
  W=${2:-/tmp/fz}; report=${3:-/dev/stdout}
  waited=0; while pgrep -f "$W/bin/fuzz_" > /dev/null && [ $waited -lt ${MAX_WAIT:-400} ]; do sleep 2; waited=$((waited + 2)); done
  {
    printf '%-18s %6s %12s %s\n' harness procs executions result
    total=0
    for h in $(ls $W/logs | sed 's/\.[0-9]*\.log$//' | sort -u); do
      runs=0; n=0; res=ok
      for l in $W/logs/$h.*.log; do
        n=$((n + 1)); r=$(sed -n 's/^stat::number_of_executed_units: *//p' $l | tail -1); runs=$((runs + ${r:-0}))
        grep -qE "ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error|deadly signal" $l && res="FOUND ($(basename $l))"
      done
      total=$((total + runs))
      printf '%-18s %6s %12s %s\n' $h $n $runs "$res"
    done
    echo "total $total ($(nproc) cores)"
  } > $report
  exit 0
fi
[ "$cmd" = start ] || { echo "fuzz_parallel.sh: start or collect, got '$cmd'" >&2; exit 2; }
seconds=${2:?SECONDS}; F=${3:-build-fuzz/tests/fuzz}; W=${4:-/tmp/fz}
mkdir -p $W/bin $W/logs $W/artifacts
for job in ${JOBS:-safetensors:2 model_config:2 verifier:2 jinja:2 tokenizer_load:1 tokenizer_encode:1 chat:1 cli_config:1 dataset:1}; do
  h=${job%%:*}; n=${job##*:}
  cp $F/fuzz_$h $W/bin/
  for i in $(seq 1 $n); do
    mkdir -p $W/corpus/$h.$i; cp $F/corpus/$h/* $W/corpus/$h.$i/ 2>/dev/null; rm -f $W/logs/$h.$i.log
    OMP_NUM_THREADS=1 nice -n 10 $W/bin/fuzz_$h -max_total_time=$seconds -print_final_stats=1 -timeout=30 \
      -rss_limit_mb=2048 -seed=$((1000 * i + 7)) -artifact_prefix=$W/artifacts/$h.$i- $W/corpus/$h.$i $F/seeds/$h \
      > $W/logs/$h.$i.log 2>&1 &
  done
done
echo "fuzz_parallel.sh: $(pgrep -fc "$W/bin/fuzz_") processes, $seconds s each"
