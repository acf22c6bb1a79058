// bench/attention_cudnn — milliseconds and TFLOP/s of cuDNN's packed causal attention
// (ops/cuda/attention_cudnn.h), forward and backward, at Qwen3-8B's heads (32 q, 8 kv, head_dim
// 128) for T = 16384 tokens in 1 to 256 equal sequences and in one ragged split. FLOPs count the
// unmasked scores only: forward 4·head_dim·q_heads·Σ n(n+1)/2, backward 2.5 times that. Every
// case runs on the same shape-bucketed graph dimensions (the length bound is T whatever the split),
// so many short sequences show what that bound costs. LOCKSTEP_SDPA_VERBOSE=1 adds each plan's
// build time and workspace.
// Usage: bench_attention_cudnn [--json out.json] [--reps N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/gpu_timing.h"
#include "core/cuda_check.h"
#include "core/tensor.h"
#include "ops/cuda/attention_cudnn.h"

using namespace lockstep;

namespace {

int g_reps = 20;

// Warm-ups also build the plans.
double time_ms(const std::function<void()>& fn) { return bench::median_ms(fn, g_reps); }


// bf16 values in [-2, 2) from a fixed linear congruential sequence, on the GPU.
Tensor random_bf16(Shape shape, uint32_t seed) {
  Tensor host = Tensor::empty(std::move(shape), DType::bf16);
  bf16* p = host.data_as<bf16>();
  uint32_t x = seed;
  for (int64_t i = 0; i < host.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = float_to_bf16(float(x >> 8) / float(1 << 22) - 2.0f);
  }
  return host.to(Device::cuda);
}

struct Case {
  std::string name;
  std::vector<int32_t> lengths;
};

struct Result {
  std::string name;
  size_t sequences;
  double forward_ms, backward_ms, forward_tflops, backward_tflops;
};

}  // namespace

int main(int argc, char** argv) {
  const char* json = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json = argv[++i];
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      g_reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--json out.json] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  if (!cudnn::sdpa_available()) {
    std::fprintf(stderr, "cuDNN SDPA is not available here (cuDNN >= 9.6, SM 9.x/10.x)\n");
    return 1;
  }
  const HeadLayout layout{32, 8, 128};
  const int64_t T = 16384;
  std::vector<Case> cases;
  for (int32_t n : {16384, 4096, 1024, 256, 64})
    cases.push_back({std::to_string(T / n) + " x " + std::to_string(n),
                     std::vector<int32_t>(size_t(T / n), n)});
  cases.push_back({"ragged 8192 .. 1, 1",
                   {8192, 4096, 2048, 1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1, 1}});

  const Tensor qkv = random_bf16({T, layout.qkv_width()}, 1);
  const Tensor dout = random_bf16({T, layout.q_width()}, 2);
  Tensor out = Tensor::empty({T, layout.q_width()}, DType::bf16, Device::cuda);
  Tensor lse = Tensor::empty({T, layout.q_heads}, DType::f32, Device::cuda);
  Tensor dqkv = Tensor::empty({T, layout.qkv_width()}, DType::bf16, Device::cuda);

  std::printf("cuDNN SDPA, q_heads %lld, kv_heads %lld, head_dim %lld, T = %lld, bf16\n",
              (long long)layout.q_heads, (long long)layout.kv_heads, (long long)layout.head_dim,
              (long long)T);
  std::printf("%-22s %10s %10s %10s %10s\n", "sequences", "fwd ms", "fwd TF/s", "bwd ms",
              "bwd TF/s");
  std::vector<Result> results;
  for (const Case& c : cases) {
    Tensor cu_host = Tensor::empty({int64_t(c.lengths.size()) + 1}, DType::i32);
    int32_t* cu_p = cu_host.data_as<int32_t>();
    cu_p[0] = 0;
    double pairs = 0;
    for (size_t i = 0; i < c.lengths.size(); ++i) {
      cu_p[i + 1] = cu_p[i] + c.lengths[i];
      pairs += 0.5 * double(c.lengths[i]) * double(c.lengths[i] + 1);
    }
    const Tensor cu = cu_host.to(Device::cuda);
    const double fwd_flops = 4.0 * double(layout.head_dim * layout.q_heads) * pairs;
    const double fwd = time_ms([&] { cudnn::attention_forward(out, lse, qkv, cu, layout); });
    const double bwd = time_ms(
        [&] { cudnn::attention_backward(dqkv, dout, qkv, out, lse, cu, layout); });
    results.push_back({c.name, c.lengths.size(), fwd, bwd, fwd_flops / fwd * 1e-9,
                       2.5 * fwd_flops / bwd * 1e-9});
    const Result& r = results.back();
    std::printf("%-22s %10.3f %10.1f %10.3f %10.1f\n", r.name.c_str(), r.forward_ms,
                r.forward_tflops, r.backward_ms, r.backward_tflops);
  }

  if (json) {
    FILE* f = std::fopen(json, "w");
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", json);
      return 1;
    }
    std::fprintf(f, "[\n");
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::fprintf(f,
                   "  {\"case\": \"%s\", \"sequences\": %zu, \"tokens\": %lld, "
                   "\"forward_ms\": %.4f, \"forward_tflops\": %.2f, \"backward_ms\": %.4f, "
                   "\"backward_tflops\": %.2f}%s\n",
                   r.name.c_str(), r.sequences, (long long)T, r.forward_ms, r.forward_tflops,
                   r.backward_ms, r.backward_tflops, i + 1 < results.size() ? "," : "");
    }
    std::fprintf(f, "]\n");
    std::fclose(f);
  }
  return 0;
}
