#!/bin/bash
# GPU-machine run of carried binaries (.carry/bin, .carry/lib, .carry/data; see docs/benchmarks.md):
# stages given as arguments, run in that order: info, tests, membound (the memory-bound kernels'
# GPU tests, then bench_gemm), train_bench, train_bench_recompute, attn_bench, torch_bench,
# compare_large, rollout_bench, hf_generate, default_job, large_grpo, decode_profile,
# decode_trace, kernel_profile.
# Logs go to $OUT; each stage has its own time limit, so one hang does not use up the lease.
set -u
cd "$(dirname "$0")/../.."  # the repository root
# cuDNN: the GPU machine has it as PyTorch's nvidia-cudnn wheel, not in the CUDA toolkit.
CUDNN_LIB=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64:$CUDNN_LIB:${LD_LIBRARY_PATH:-}
B=.carry/bin
info() { nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; nvcc --version | tail -1; ls /usr/local/cuda/lib64 | grep -i cudnn | head -3; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; }
NCU=/usr/local/cuda/bin/ncu
# ncu_reports NAME: the details page and the SASS stall hot spots of /tmp/NAME.ncu-rep, into $OUT.
ncu_reports() {
  $NCU --import /tmp/$1.ncu-rep --page details > $OUT/$1_details.txt 2>&1
  $NCU --import /tmp/$1.ncu-rep --page source --print-source sass --csv 2>&1 | python3 scripts/dev/ncu_sass_hotspots.py > $OUT/$1_sass.txt 2>&1
}
for stage in "$@"; do
  echo "=== $stage $(date +%T)"
  case $stage in
    info) info > $OUT/info.txt 2>&1 ;;
    tests)
      echo "cudnn lib: $CUDNN_LIB" >> $OUT/summary.txt
      for t in test_gpu test_model_gpu test_convert_gpu; do
        timeout 300 $B/$t --gtest_color=no > $OUT/$t.log 2>&1; echo "$t rc=$?" >> $OUT/summary.txt
        grep -E "^\[  (FAILED|PASSED) |tests ran" $OUT/$t.log | tail -40 >> $OUT/summary.txt
        cat $OUT/$t.log >> $OUT/tests.txt; rm $OUT/$t.log
      done ;;
    train_bench)
      mkdir -p $OUT/json
      timeout 400 $B/bench_train_step --model qwen3-8b --layers 8 --json $OUT/json/train_step_8b.json > $OUT/train_step.txt 2>&1; echo "8b rc=$?" >> $OUT/train_step.txt
      timeout 300 $B/bench_train_step --model qwen3-1.7b --json $OUT/json/train_step_1.7b.json >> $OUT/train_step.txt 2>&1; echo "1.7b rc=$?" >> $OUT/train_step.txt ;;
    train_bench_recompute)
      mkdir -p $OUT/json
      timeout 300 $B/bench_train_step --model qwen3-8b --layers 8 --recompute 1 --json $OUT/json/train_step_8b_recompute.json >> $OUT/train_step.txt 2>&1
      timeout 300 $B/bench_train_step --model qwen3-1.7b --recompute 1 --json $OUT/json/train_step_1.7b_recompute.json >> $OUT/train_step.txt 2>&1 ;;
    membound)  # memory-bound kernels: their GPU tests, then bench_gemm (with AdamW)
      timeout 300 $B/test_gpu --gtest_color=no \
        --gtest_filter='*Quant*:*Fp8*:*E4m3*:*AdamW*:*SwiGlu*:*RmsNorm*' > $OUT/membound_tests.log 2>&1
      echo "membound tests rc=$?" >> $OUT/summary.txt
      grep -E "^\[  (FAILED|PASSED) |tests ran" $OUT/membound_tests.log | tail -20 >> $OUT/summary.txt
      mkdir -p $OUT/json
      timeout 400 $B/bench_gemm --json $OUT/json/bench_gemm.json > $OUT/bench_gemm.txt 2>&1; echo "rc=$?" >> $OUT/bench_gemm.txt ;;
    attn_bench) timeout 200 $B/bench_attention > $OUT/attention.txt 2>&1
      LOCKSTEP_SDPA_VERBOSE=1 timeout 200 $B/bench_attention_cudnn >> $OUT/attention.txt 2>&1 ;;
    torch_bench)
      mkdir -p $OUT/json
      timeout 300 python3 scripts/dev/bench_torch_train.py --model qwen3-8b --layers 8 --json $OUT/json/torch_8b.json > $OUT/torch.txt 2>&1
      timeout 300 python3 scripts/dev/bench_torch_train.py --model qwen3-1.7b --json $OUT/json/torch_1.7b.json >> $OUT/torch.txt 2>&1 ;;
    rollout_bench)
      mkdir -p $OUT/json
      timeout 280 $B/bench_rollout --new 1024 --json $OUT/json/rollout_1024.json > $OUT/rollout.txt 2>&1; echo "rc=$?" >> $OUT/rollout.txt
      timeout 200 $B/bench_rollout --new 4096 --batch 1,64 --max-seconds 60 --json $OUT/json/rollout_4096.json >> $OUT/rollout.txt 2>&1; echo "rc=$?" >> $OUT/rollout.txt ;;
    hf_generate)
      mkdir -p $OUT/json
      timeout 240 python3 scripts/dev/bench_hf_generate.py --new 1024 --batch 1,64 --json $OUT/json/hf_generate_1024.json > $OUT/hf_generate.txt 2>&1 ;;
    default_job)
      (time timeout 300 $B/lockstep train --run.out_dir=/tmp/default --model.device=cuda) > $OUT/default_job.txt 2>&1
      cp /tmp/default/metrics.png $OUT/default_metrics.png; mkdir -p $OUT/json; cp /tmp/default/*.jsonl $OUT/json/ ;;
    large_grpo)
      timeout 120 python3 scripts/dev/make_random_model.py /tmp/q17 --tokenizer .carry/data/qwen3-tokenizer > $OUT/large_grpo.txt 2>&1
      for p in fp8 bf16; do
        timeout 200 $B/lockstep train --model.path=/tmp/q17 --model.precision=$p --data.train=.carry/data/gsm8k/train.jsonl \
          --data.test=.carry/data/gsm8k/test.jsonl --data.chat_template=qwen3-no-think --sft.steps=0 --run.steps=4 \
          --rollout.prompts_per_step=16 --rollout.samples_per_prompt=8 --rollout.max_new_tokens=256 --run.eval_every=0 \
          --run.eval_problems=16 --optim.lr=1e-6 --run.out_dir=/tmp/large_$p >> $OUT/large_grpo.txt 2>&1
        mkdir -p $OUT/json; cp /tmp/large_$p/metrics.jsonl $OUT/json/large_grpo_$p.jsonl
      done ;;
    decode_profile)  # ncu kernel-time sums of eager batch-64 decode steps (4 layers, ~1K context)
      for r in bf16 fp8; do
        timeout 150 $NCU --cache-control none --clock-control none --metrics gpu__time_duration.sum \
          --csv $B/bench_rollout --layers 4 --prompt 1024 --new 32 --batch 64 --recipes $r --graphs 0 \
          --memory-fraction 0.2 2>$OUT/ncu_err_$r.txt | python3 scripts/dev/ncu_kernel_sums.py > $OUT/decode_b64_${r}_kernels.txt
      done ;;
    decode_trace)  # in-flow kernel timeline of graph-replayed decode steps (bench/kernel_trace.cpp: needs
                   # .carry/lib/liblockstep_kernel_trace.so and libcupti.so.13), per recipe and batch
      for r in fp8 bf16; do for b in 64 1; do
        LOCKSTEP_KERNEL_TRACE=/tmp/trace_${r}_$b.csv CUDA_INJECTION64_PATH=$PWD/.carry/lib/liblockstep_kernel_trace.so \
          timeout 120 $B/bench_rollout --prompt 1024 --new 64 --batch $b --recipes $r > /dev/null 2>> $OUT/decode_trace_err.txt
        python3 scripts/dev/kernel_trace_steps.py /tmp/trace_${r}_$b.csv --period auto > $OUT/decode_trace_${r}_b$b.txt 2>&1
      done; done ;;
    kernel_profile)  # ncu of the fp8 small-T GEMM alone and the decode attention: details, SASS stall hot spots
      for shape in qwen3-8b:o:1 qwen3-8b:o:64 qwen3-8b:down:64; do
        name=ncu_small_t_$(echo $shape | tr ':-' '__')
        timeout 150 $NCU --set full --import-source no -k regex:small_t_kernel --launch-skip 3 \
          --launch-count 1 -f -o /tmp/$name $B/bench_gemm --small-t $shape --reps 5 > $OUT/$name.log 2>&1
        ncu_reports $name
      done
      # the paged decode attention at batch 64, ~1K context (eager steps; a launch after the warm-up)
      timeout 150 $NCU --set full --import-source no -k regex:decode_kernel --launch-skip 40 \
        --launch-count 1 -f -o /tmp/ncu_decode_attention $B/bench_rollout --layers 2 --prompt 1024 --new 32 \
        --batch 64 --recipes bf16 --graphs 0 --memory-fraction 0.2 > $OUT/ncu_decode_attention.log 2>&1
      ncu_reports ncu_decode_attention ;;
    compare_large) timeout 500 python3 scripts/dev/compare_hf.py --large --bin $B/lockstep_model_check > $OUT/compare_large.txt 2>&1 ;;
  esac
done
# At most 8 files come back: the JSON results travel as one archive, and when more than 8 files
# would be left, everything but summary.txt and earlier archives travels in results-<pid>.tar.gz
# (the rest would be lost; one archive per invocation of this script).
if [ -d $OUT/json ]; then tar czf $OUT/json-$$.tar.gz -C $OUT json && rm -r $OUT/json; fi
if [ "$(find $OUT -type f | wc -l)" -gt 8 ]; then
  (cd $OUT && find . -type f ! -name summary.txt ! -name 'results-*.tar.gz' | sort > /tmp/device_run_files.txt \
    && tar czf results-$$.tar.gz -T /tmp/device_run_files.txt && xargs rm < /tmp/device_run_files.txt)
fi
echo "=== end $(date +%T)"
