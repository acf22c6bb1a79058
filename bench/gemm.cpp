// bench/gemm — TFLOP/s of the bf16 and fp8 linear-layer GEMMs (FProp, DGrad, WGrad) at the
// Qwen3-1.7B and Qwen3-8B shapes with T = 8192 tokens, FProp at decode shapes (cuBLASLt bf16 and
// fp8, the fp8 small-T kernel, and fp8 as dispatched between the two), and the GB/s of the
// memory-bound kernels (FP8 quantization, AdamW) against a measured device-to-device copy. Every
// cuBLASLt GEMM is timed twice: with the autotuned algorithm (the default) and with cuBLASLt's
// first heuristic choice (what LOCKSTEP_GEMM_AUTOTUNE=0 selects).
// Usage: bench_gemm [--json out.json] [--reps N] [--decode-only] [--small-t MODEL:LINEAR:T] [--exact]
//                   [--grouped]
//   --decode-only: the decode table alone.
//   --grouped: the expert GEMMs of a mixture-of-experts layer alone (Qwen3-30B-A3B's shapes): the
//     grouped fp8 and bf16 GEMMs (ops/gemm.h gemm_fp8_grouped, gemm_bf16_grouped_*) against each
//     other and the per-expert loops of the ordinary fp8 and bf16 GEMMs, at training and decode
//     token counts, uniform and skewed expert loads.
//   --exact: the exact forward kernels (ops/forward_kernels.h): fp8 FProp on the batch-invariant
//     kernel, bf16 FProp without split-K.
//   --small-t qwen3-8b:o:64: only the fp8 small-T kernel at that shape, --reps calls (L2 flushed
//     before each) and their median — one kernel to put under a profiler (ncu).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "bench/gpu_timing.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "numerics/quantize.h"
#include "ops/adamw.h"
#include "ops/gemm.h"
#include "ops/cuda/gemm_fp8_small_t.h"
#include "ops/forward_kernels.h"
#include "ops/gemm_backends.h"

using namespace lockstep;

namespace {

int g_reps = 20;

// `before_each`: untimed work before every timed call (an L2 flush).
double time_ms(const std::function<void()>& fn, const std::function<void()>& before_each = {}) {
  return bench::median_ms(fn, g_reps, before_each);
}


struct Timing {
  double tuned, heuristic;  // median ms
};

// fn timed with autotuned plans and with the heuristic's first choice (each makes its own plan
// in the warm-up calls).
Timing time_both(const std::function<void()>& fn, const std::function<void()>& before_each = {}) {
  const int previous = cuda::gemm_set_algo_choice(-1);
  const double tuned = time_ms(fn, before_each);
  cuda::gemm_set_algo_choice(0);
  const double heuristic = time_ms(fn, before_each);
  cuda::gemm_set_algo_choice(previous);
  return {tuned, heuristic};
}

// Random bf16 / f32 on the device without a host round trip: a counter hash, N(0,1)-ish.
Tensor random_device(Shape shape, DType dtype) {
  Tensor host = Tensor::empty(shape, dtype);
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (int64_t i = 0; i < host.numel(); ++i) {
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    const float v = (float(s >> 40) / float(1 << 24) - 0.5f) * 3.4641f;  // uniform, unit variance
    if (dtype == DType::bf16) host.data_as<bf16>()[i] = float_to_bf16(v);
    else host.data_as<float>()[i] = v;
  }
  return host.to(Device::cuda);
}

struct Linear { const char* model; const char* name; int64_t n, k; };

const Linear kLinears[] = {
    {"qwen3-1.7b", "qkv", 4096, 2048},   {"qwen3-1.7b", "o", 2048, 2048},
    {"qwen3-1.7b", "gate_up", 12288, 2048}, {"qwen3-1.7b", "down", 2048, 6144},
    {"qwen3-8b", "qkv", 6144, 4096},     {"qwen3-8b", "o", 4096, 4096},
    {"qwen3-8b", "gate_up", 24576, 4096}, {"qwen3-8b", "down", 4096, 12288},
};

std::string json_rows;
void add_json(const std::string& row) { json_rows += (json_rows.empty() ? "  " : ",\n  ") + row; }

void print_training_table(const char* title, const double (*tf)[8]) {
  std::printf("\n%s\n", title);
  std::printf("%-11s %-8s %6s %6s | %8s %8s %6s | %8s %8s %6s | %8s %8s %6s | %8s %8s %6s\n", "model",
              "linear", "N", "K", "fprop16", "fprop8", "x", "dgrad16", "dgrad8", "x", "wgrad16", "wgrad8",
              "x", "wgrad=16", "wgrad=8", "x");
  for (size_t i = 0; i < std::size(kLinears); ++i) {
    const Linear& l = kLinears[i];
    const double* t = tf[i];
    std::printf("%-11s %-8s %6ld %6ld | %8.0f %8.0f %5.2fx | %8.0f %8.0f %5.2fx | %8.0f %8.0f %5.2fx | %8.0f %8.0f %5.2fx\n",
                l.model, l.name, long(l.n), long(l.k), t[0], t[1], t[1] / t[0], t[2], t[3], t[3] / t[2], t[4],
                t[5], t[5] / t[4], t[6], t[7], t[7] / t[6]);
  }
}

void bench_training(int64_t T) {
  const char* names[8] = {"fprop_bf16", "fprop_fp8", "dgrad_bf16", "dgrad_fp8",
                          "wgrad_acc_bf16", "wgrad_acc_fp8", "wgrad_bf16", "wgrad_fp8"};
  double tuned[std::size(kLinears)][8], heuristic[std::size(kLinears)][8];
  for (size_t li = 0; li < std::size(kLinears); ++li) {
    const Linear& l = kLinears[li];
    const int64_t N = l.n, K = l.k;
    const double flops = 2.0 * double(T) * double(N) * double(K);
    Tensor x = random_device({T, K}, DType::bf16), w = random_device({N, K}, DType::bf16);
    Tensor dy = random_device({T, N}, DType::bf16);
    Tensor y = Tensor::empty({T, N}, DType::bf16, Device::cuda);
    Tensor dx = Tensor::empty({T, K}, DType::bf16, Device::cuda);
    Tensor dw = Tensor::empty({N, K}, DType::f32, Device::cuda);
    Fp8Rows qx = Fp8Rows::empty(T, K, Device::cuda), qxt = Fp8Rows::empty_columnwise(T, K, Device::cuda);
    Fp8Rows qdy = Fp8Rows::empty(T, N, Device::cuda), qdyt = Fp8Rows::empty_columnwise(T, N, Device::cuda);
    Fp8Weight qw = Fp8Weight::empty(N, K, Device::cuda);
    quantize_rows_and_columns(qx, qxt, x);
    quantize_rows_and_columns(qdy, qdyt, dy);
    quantize_weight(qw, w);
    const std::function<void()> ops[8] = {
        [&] { gemm_fprop(y, x, w); },        [&] { gemm_fprop(y, qx, qw); },
        [&] { gemm_dgrad(dx, dy, w); },      [&] { gemm_dgrad(dx, qdy, qw); },
        [&] { gemm_wgrad(dw, dy, x, true); }, [&] { gemm_wgrad(dw, qdyt, qxt, true); },
        [&] { gemm_wgrad(dw, dy, x, false); }, [&] { gemm_wgrad(dw, qdyt, qxt, false); }};
    for (int i = 0; i < 8; ++i) {
      const Timing t = time_both(ops[i]);
      tuned[li][i] = flops / (t.tuned * 1e-3) / 1e12;
      heuristic[li][i] = flops / (t.heuristic * 1e-3) / 1e12;
      add_json("{\"kind\": \"gemm\", \"model\": \"" + std::string(l.model) + "\", \"linear\": \"" + l.name +
               "\", \"op\": \"" + names[i] + "\", \"T\": " + std::to_string(T) + ", \"N\": " + std::to_string(N) +
               ", \"K\": " + std::to_string(K) + ", \"ms\": " + std::to_string(t.tuned) +
               ", \"tflops\": " + std::to_string(tuned[li][i]) + ", \"ms_heuristic\": " +
               std::to_string(t.heuristic) + ", \"tflops_heuristic\": " + std::to_string(heuristic[li][i]) + "}");
    }
  }
  const std::string shape = "T = " + std::to_string(T) + " tokens (TFLOP/s; fp8 excludes quantization)";
  std::printf("\n(wgrad: dW += dyT x into the fp32 gradient, as with micro-batches; wgrad=: dW = dyT x)");
  print_training_table(("Training GEMMs, autotuned, " + shape).c_str(), tuned);
  print_training_table(("Training GEMMs, heuristic's first choice (LOCKSTEP_GEMM_AUTOTUNE=0), " + shape).c_str(),
                       heuristic);
  std::printf("\nAutotuned speedup over the heuristic's first choice (heuristic time / autotuned time)\n");
  std::printf("%-11s %-8s | %7s %7s %7s %7s %7s %7s %7s %7s\n", "model", "linear", "fprop16", "fprop8",
              "dgrad16", "dgrad8", "wgrad16", "wgrad8", "wgrad=16", "wgrad=8");
  for (size_t li = 0; li < std::size(kLinears); ++li) {
    std::printf("%-11s %-8s |", kLinears[li].model, kLinears[li].name);
    for (int i = 0; i < 8; ++i) std::printf(" %6.3fx", tuned[li][i] / heuristic[li][i]);
    std::printf("\n");
  }
}

// Decode shapes, L2 flushed before every timed call (a decode step reads each layer's weights
// from HBM once): bf16 and fp8 on cuBLASLt (autotuned; heuristic's choice in the JSON), fp8 on the
// small-T kernel (ops/cuda/gemm_fp8_small_t.cu) with its weight bytes per second, and fp8 as
// dispatched (kFp8SmallTAuto: the faster of the two, timed on the shape's first call) with its pick.
void bench_decode() {
  const bench::L2Flush flush;
  const std::function<void()> flush_l2 = flush.fn();
  std::printf("\nDecode-shape FProp, L2 flushed: microseconds of bf16 and fp8 on cuBLASLt (autotuned), fp8 on the\n"
              "small-T kernel (its weight GB/s) and fp8 as dispatched (its pick); speedups of the dispatched fp8\n");
  std::printf("%-11s %-8s %4s | %8s %8s %10s %9s %-8s | %12s | %9s %9s\n", "model", "linear", "T", "bf16 us",
              "fp8 us", "small-T us", "auto us", "pick", "small-T GB/s", "bf16/auto", "fp8/auto");
  const int previous = cuda::gemm_set_fp8_small_t(0);  // restored at the end
  for (const Linear& l : kLinears) {
    const int64_t N = l.n, K = l.k;
    Tensor w = random_device({N, K}, DType::bf16);
    Fp8Weight qw = Fp8Weight::empty(N, K, Device::cuda);
    quantize_weight(qw, w);
    for (int64_t T : {1, 16, 32, 64}) {
      Tensor x = random_device({T, K}, DType::bf16), y = Tensor::empty({T, N}, DType::bf16, Device::cuda);
      Fp8Rows qx = Fp8Rows::empty(T, K, Device::cuda);
      quantize_rows(qx, x);
      const Timing bf16 = time_both([&] { gemm_fprop(y, x, w); }, flush_l2);
      cuda::gemm_set_fp8_small_t(0);
      const Timing fp8 = time_both([&] { gemm_fprop(y, qx, qw); }, flush_l2);
      cuda::gemm_set_fp8_small_t(64);
      const double small_t = time_ms([&] { gemm_fprop(y, qx, qw); }, flush_l2);
      cuda::gemm_set_fp8_small_t(cuda::kFp8SmallTAuto);
      const double dispatched = time_ms([&] { gemm_fprop(y, qx, qw); }, flush_l2);
      const bool picked_small_t = cuda::gemm_fp8_uses_small_t(T, N, K, DType::bf16);
      const double gbs = double(N * K) / (small_t * 1e-3) / 1e9;
      std::printf("%-11s %-8s %4ld | %8.1f %8.1f %10.1f %9.1f %-8s | %12.0f | %8.2fx %8.2fx\n", l.model, l.name,
                  long(T), bf16.tuned * 1e3, fp8.tuned * 1e3, small_t * 1e3, dispatched * 1e3,
                  picked_small_t ? "small-T" : "cuBLASLt", gbs, bf16.tuned / dispatched, fp8.tuned / dispatched);
      add_json("{\"kind\": \"decode\", \"model\": \"" + std::string(l.model) + "\", \"linear\": \"" + l.name +
               "\", \"T\": " + std::to_string(T) + ", \"N\": " + std::to_string(N) + ", \"K\": " + std::to_string(K) +
               ", \"bf16_ms\": " + std::to_string(bf16.tuned) + ", \"fp8_ms\": " + std::to_string(fp8.tuned) +
               ", \"fp8_small_t_ms\": " + std::to_string(small_t) + ", \"fp8_auto_ms\": " +
               std::to_string(dispatched) + ", \"fp8_auto_pick\": \"" + (picked_small_t ? "small_t" : "cublaslt") +
               "\", \"bf16_ms_heuristic\": " + std::to_string(bf16.heuristic) + ", \"fp8_ms_heuristic\": " +
               std::to_string(fp8.heuristic) + "}");
    }
  }
  cuda::gemm_set_fp8_small_t(previous);
}

struct SmallTShape {
  const Linear* linear = nullptr;
  int64_t T = 0;
};

// "model:linear:T" (a kLinears entry, 1 ≤ T ≤ 64).
SmallTShape parse_small_t(const std::string& spec) {
  const size_t first = spec.find(':'), second = spec.find(':', first + 1);
  SmallTShape shape;
  if (second != std::string::npos) {
    for (const Linear& l : kLinears)
      if (spec.substr(0, first) == l.model && spec.substr(first + 1, second - first - 1) == l.name) shape.linear = &l;
    shape.T = std::atoll(spec.c_str() + second + 1);
  }
  LOCKSTEP_CHECK(shape.linear && shape.T >= 1 && shape.T <= cuda::kFp8SmallTMaxTokens, "--small-t: ",
                 "expected MODEL:LINEAR:T with a model and linear of the decode table and 1 <= T <= ",
                 cuda::kFp8SmallTMaxTokens, ", got '", spec, "'");
  return shape;
}

// --small-t: the small-T kernel alone at one decode shape.
void bench_one_small_t(const SmallTShape& shape) {
  const Linear* linear = shape.linear;
  const int64_t T = shape.T;
  const bench::L2Flush flush;
  Tensor w = random_device({linear->n, linear->k}, DType::bf16), x = random_device({T, linear->k}, DType::bf16);
  Tensor y = Tensor::empty({T, linear->n}, DType::bf16, Device::cuda);
  Fp8Weight qw = Fp8Weight::empty(linear->n, linear->k, Device::cuda);
  Fp8Rows qx = Fp8Rows::empty(T, linear->k, Device::cuda);
  quantize_weight(qw, w);
  quantize_rows(qx, x);
  const int previous = cuda::gemm_set_fp8_small_t(64);
  const double ms = time_ms([&] { gemm_fprop(y, qx, qw); }, flush.fn());
  cuda::gemm_set_fp8_small_t(previous);
  std::printf("small-T %s %s T=%ld: %.1f us (median of %d, L2 flushed)\n", linear->model, linear->name, long(T),
              ms * 1e3, g_reps);
}

// Qwen3-30B-A3B's experts: hidden 2048, moe_intermediate 768, 128 experts, top-8.
constexpr int64_t kExperts = 128, kTopK = 8;
const Linear kExpertLinears[] = {{"qwen3-30b-a3b", "gate_up", 1536, 2048}, {"qwen3-30b-a3b", "down", 2048, 768}};

// Rows per expert of `rows` (tokens · top-k) routed rows: uniform (equal shares), or skewed (expert
// e's share ∝ 1/(e + 1), Zipf: the first expert takes ~18% of the rows, the last ~0.1%).
std::vector<int64_t> expert_loads(int64_t rows, bool skewed) {
  std::vector<double> share(static_cast<size_t>(kExperts));
  for (int64_t e = 0; e < kExperts; ++e) share[size_t(e)] = skewed ? 1.0 / double(e + 1) : 1.0;
  double total = 0;
  for (double v : share) total += v;
  std::vector<int64_t> loads(static_cast<size_t>(kExperts));
  int64_t given = 0;
  for (int64_t e = 0; e < kExperts; ++e) given += loads[size_t(e)] = int64_t(double(rows) * share[size_t(e)] / total);
  for (int64_t e = 0; given < rows; e = (e + 1) % kExperts) ++loads[size_t(e)], ++given;  // the rounding's rest
  return loads;
}

// ‖a − b‖ / ‖b‖ of two bf16 tensors on the device.
double rel_error_bf16(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::cpu), hb = b.to(Device::cpu);
  double num = 0, den = 0;
  for (int64_t i = 0; i < ha.numel(); ++i) {
    const double x = bf16_to_float(ha.data_as<bf16>()[i]), y = bf16_to_float(hb.data_as<bf16>()[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / den);
}

// --grouped: FProp and DGrad of the experts' linears, TFLOP/s of the useful work (2·rows·N·K), for
// the grouped fp8 kernel, the grouped bf16 GEMM (one cuBLAS grouped call), the per-expert loop of
// fp8 GEMMs on cuBLASLt (small-T off), that loop as dispatched (cuBLASLt or the small-T kernel per
// expert, the model's loop today), and the per-expert loop of bf16 GEMMs; the grouped fp8 GEMM's
// speedup over the grouped bf16 one and over the loops; each grouped output's relative error
// against its recipe's cuBLASLt loop (err8: fp8, err16: bf16). Each expert has its own weight
// memory (the loops' reads are not served from L2 by a shared one); the bf16 grouped GEMM reads
// the experts' weights where they are, as the fp8 one reads their stacked copy.
void bench_grouped() {
  std::printf("\nExpert GEMMs of Qwen3-30B-A3B (%ld experts, top-%ld), TFLOP/s (fp8 excludes quantization)\n",
              long(kExperts), long(kTopK));
  std::printf("%-8s %-5s %5s %6s %-7s %5s | %8s %9s %8s %8s %8s | %8s %8s %9s | %7s %7s\n", "linear", "op", "T",
              "rows", "loads", "most", "grouped8", "grouped16", "loop8", "loop8 d", "loop16", "g8/g16", "g8/loop8",
              "g8/loop16", "err8", "err16");
  const int previous = cuda::gemm_set_fp8_small_t(cuda::kFp8SmallTAuto);
  for (const Linear& l : kExpertLinears) {
    const int64_t N = l.n, K = l.k;
    const Tensor master = random_device({N, K}, DType::bf16);
    std::vector<Fp8Weight> fp8(static_cast<size_t>(kExperts));
    std::vector<Tensor> bf16(static_cast<size_t>(kExperts));
    std::vector<Fp8Blocks> ws, wts;
    for (int64_t e = 0; e < kExperts; ++e) {
      fp8[size_t(e)] = Fp8Weight::empty(N, K, Device::cuda);
      quantize_weight(fp8[size_t(e)], master);
      bf16[size_t(e)] = Tensor::empty({N, K}, DType::bf16, Device::cuda);
      bf16[size_t(e)].copy_from(master);
      ws.push_back(fp8[size_t(e)].w);
      wts.push_back(fp8[size_t(e)].wt);
    }
    const Fp8Blocks w = stack_fp8_blocks(ws), wt = stack_fp8_blocks(wts);
    ws.clear(), wts.clear();
    for (const int64_t T : {int64_t(64), int64_t(256), int64_t(8192)})
      for (const bool skewed : {false, true}) {
        const int64_t rows = T * kTopK;
        const std::vector<int64_t> loads = expert_loads(rows, skewed);
        std::vector<int64_t> offsets{0};
        for (int64_t n : loads) offsets.push_back(offsets.back() + n);
        Tensor host_offsets = Tensor::empty({kExperts + 1}, DType::i64);
        std::copy(offsets.begin(), offsets.end(), host_offsets.data_as<int64_t>());
        const Tensor device_offsets = host_offsets.to(Device::cuda);
        const Tensor x = random_device({rows, K}, DType::bf16), dy = random_device({rows, N}, DType::bf16);
        Fp8Rows qx = Fp8Rows::empty(rows, K, Device::cuda), qdy = Fp8Rows::empty(rows, N, Device::cuda);
        quantize_rows(qx, x);
        quantize_rows(qdy, dy);
        // The loops' inputs: each expert's rows quantized alone, as the model's loop does.
        std::vector<Fp8Rows> qx_e(static_cast<size_t>(kExperts)), qdy_e(static_cast<size_t>(kExperts));
        for (int64_t e = 0; e < kExperts; ++e) {
          const int64_t b = offsets[size_t(e)], n = loads[size_t(e)];
          if (n == 0) continue;
          qx_e[size_t(e)] = Fp8Rows::empty(n, K, Device::cuda);
          qdy_e[size_t(e)] = Fp8Rows::empty(n, N, Device::cuda);
          quantize_rows(qx_e[size_t(e)], x.rows(b, b + n));
          quantize_rows(qdy_e[size_t(e)], dy.rows(b, b + n));
        }
        const int64_t most = *std::max_element(loads.begin(), loads.end());
        const double flops = 2.0 * double(rows) * double(N) * double(K);
        // FProp: out [rows, N] from x; DGrad: out [rows, K] from dy.
        for (const bool dgrad : {false, true}) {
          Tensor grouped = Tensor::empty({rows, dgrad ? K : N}, DType::bf16, Device::cuda);
          Tensor grouped16 = Tensor::empty(grouped.shape(), DType::bf16, Device::cuda);
          Tensor looped = Tensor::empty(grouped.shape(), DType::bf16, Device::cuda);
          const auto run_grouped = [&] {
            gemm_fp8_grouped(grouped, dgrad ? qdy : qx, dgrad ? wt : w, offsets, device_offsets);
          };
          const auto run_grouped16 = [&] {
            if (dgrad) gemm_bf16_grouped_dgrad(grouped16, dy, bf16, offsets);
            else gemm_bf16_grouped_fprop(grouped16, x, bf16, offsets);
          };
          const auto run_loop8 = [&] {
            for (int64_t e = 0; e < kExperts; ++e) {
              if (loads[size_t(e)] == 0) continue;
              Tensor out = looped.rows(offsets[size_t(e)], offsets[size_t(e + 1)]);
              if (dgrad) gemm_dgrad(out, qdy_e[size_t(e)], fp8[size_t(e)]);
              else gemm_fprop(out, qx_e[size_t(e)], fp8[size_t(e)]);
            }
          };
          const auto run_loop16 = [&] {
            for (int64_t e = 0; e < kExperts; ++e) {
              const int64_t b = offsets[size_t(e)], end = offsets[size_t(e + 1)];
              if (b == end) continue;
              Tensor out = looped.rows(b, end);
              if (dgrad) gemm_dgrad(out, dy.rows(b, end), bf16[size_t(e)]);
              else gemm_fprop(out, x.rows(b, end), bf16[size_t(e)]);
            }
          };
          const double g8 = time_ms(run_grouped), g16 = time_ms(run_grouped16);
          cuda::gemm_set_fp8_small_t(cuda::kFp8SmallTAuto);
          const double loop8_dispatched = time_ms(run_loop8);
          cuda::gemm_set_fp8_small_t(0);
          const double loop8 = time_ms(run_loop8);  // leaves the cuBLASLt loop's output in `looped`
          const double err8 = rel_error_bf16(grouped, looped);
          const double loop16 = time_ms(run_loop16);  // leaves the bf16 loop's output in `looped`
          const double err16 = rel_error_bf16(grouped16, looped);
          cuda::gemm_set_fp8_small_t(cuda::kFp8SmallTAuto);
          auto tf = [&](double ms) { return flops / (ms * 1e-3) / 1e12; };
          const char* op = dgrad ? "dgrad" : "fprop";
          const char* shape = skewed ? "skewed" : "uniform";
          std::printf("%-8s %-5s %5ld %6ld %-7s %5ld | %8.1f %9.1f %8.1f %8.1f %8.1f | %7.2fx %7.2fx %8.2fx | %7.1e "
                      "%7.1e\n", l.name, op, long(T), long(rows), shape, long(most), tf(g8), tf(g16), tf(loop8),
                      tf(loop8_dispatched), tf(loop16), g16 / g8, loop8 / g8, loop16 / g8, err8, err16);
          add_json("{\"kind\": \"grouped\", \"model\": \"" + std::string(l.model) + "\", \"linear\": \"" + l.name +
                   "\", \"op\": \"" + op + "\", \"T\": " + std::to_string(T) + ", \"rows\": " + std::to_string(rows) +
                   ", \"loads\": \"" + shape + "\", \"most\": " + std::to_string(most) + ", \"N\": " +
                   std::to_string(N) + ", \"K\": " + std::to_string(K) + ", \"grouped_fp8_ms\": " +
                   std::to_string(g8) + ", \"grouped_bf16_ms\": " + std::to_string(g16) +
                   ", \"grouped_fp8_speedup_over_bf16\": " + std::to_string(g16 / g8) + ", \"loop_fp8_cublaslt_ms\": " +
                   std::to_string(loop8) + ", \"loop_fp8_dispatched_ms\": " + std::to_string(loop8_dispatched) +
                   ", \"loop_bf16_ms\": " + std::to_string(loop16) + ", \"rel_err_vs_loop_fp8\": " +
                   std::to_string(err8) + ", \"rel_err_grouped_bf16_vs_loop_bf16\": " + std::to_string(err16) + "}");
        }
      }
  }
  cuda::gemm_set_fp8_small_t(previous);
}

// One memory-bound kernel's line: µs and % of copy for a single call (median, as timed since the
// first runs) and back to back (launch latency hidden, as in a training step).
void memory_bound_row(const std::string& name, double bytes, double copy_gbs, const std::function<void()>& fn) {
  const double ms = time_ms(fn), b2b_ms = bench::back_to_back_ms(fn, g_reps);
  const double gbs = bytes / (ms * 1e-3) / 1e9, b2b_gbs = bytes / (b2b_ms * 1e-3) / 1e9;
  std::printf("%-46s %9.1f %9.0f %6.0f%% %9.1f %9.0f %6.0f%%\n", name.c_str(), ms * 1e3, gbs, 100 * gbs / copy_gbs,
              b2b_ms * 1e3, b2b_gbs, 100 * b2b_gbs / copy_gbs);
  add_json("{\"kind\": \"memory_bound\", \"kernel\": \"" + name + "\", \"ms\": " + std::to_string(ms) +
           ", \"gbs\": " + std::to_string(gbs) + ", \"ms_back_to_back\": " + std::to_string(b2b_ms) +
           ", \"gbs_back_to_back\": " + std::to_string(b2b_gbs) + ", \"copy_gbs\": " + std::to_string(copy_gbs) + "}");
}

// The FP8 quantization kernels, and AdamW over a 100M-parameter f32 tensor.
void bench_memory_bound() {
  const int64_t T = 8192, K = 4096, N = 12288;
  const double copy_gbs = bench::copy_bandwidth_gbs(g_reps);
  std::printf("\nMemory-bound kernels (GB/s of bytes read + written) vs device-to-device copy: %.0f GB/s\n", copy_gbs);
  std::printf("%-46s %9s %9s %7s %9s %9s %7s\n", "kernel", "us", "GB/s", "of copy", "us b2b", "GB/s b2b", "of copy");

  Tensor x = random_device({T, K}, DType::bf16);
  Tensor w32 = random_device({N, K}, DType::f32), w16 = random_device({N, K}, DType::bf16);
  Fp8Rows q = Fp8Rows::empty(T, K, Device::cuda), qt = Fp8Rows::empty_columnwise(T, K, Device::cuda);
  Fp8Weight qw = Fp8Weight::empty(N, K, Device::cuda);
  const double act = double(T * K), wel = double(N * K);
  struct Quantizer { const char* name; double bytes; std::function<void()> fn; };
  const Quantizer quantizers[] = {
      {"rows 1x128 (bf16 8192x4096)", act * 3 + act / 32, [&] { quantize_rows(q, x); }},
      {"columns 128x1 (bf16 8192x4096)", act * 3 + act / 32, [&] { quantize_columns(qt, x); }},
      {"rows+columns fused", act * 4 + act / 16, [&] { quantize_rows_and_columns(q, qt, x); }},
      {"weight 128x128 + transpose (f32 12288x4096)", wel * 6, [&] { quantize_weight(qw, w32); }},
      {"weight 128x128 + transpose (bf16 12288x4096)", wel * 4, [&] { quantize_weight(qw, w16); }},
  };
  for (const Quantizer& k : quantizers) memory_bound_row(k.name, k.bytes, copy_gbs, k.fn);
  x = w32 = w16 = Tensor();
  q = qt = Fp8Rows();
  qw = Fp8Weight();

  // AdamW: param, m, v, grad read, param, m, v written (28 bytes a parameter), plus the copies.
  const int64_t an = 12288, ak = 8192;
  const double params = double(an * ak);
  Tensor p = random_device({an, ak}, DType::f32), g = random_device({an, ak}, DType::f32);
  Tensor m = Tensor::zeros({an, ak}, DType::f32, Device::cuda), v = Tensor::zeros({an, ak}, DType::f32, Device::cuda);
  Tensor bf16 = Tensor::empty({an, ak}, DType::bf16, Device::cuda);
  Fp8Weight fp8 = Fp8Weight::empty(an, ak, Device::cuda);
  const double fp8_bytes = 2 * params + double(fp8.w.scales.nbytes() + fp8.wt.scales.nbytes());
  int64_t step = 1;
  const auto adamw = [&](const WeightCopies& copies) {
    return [&, copies] { adamw_step(p, m, v, g, AdamWHyper{}, step++, 1.0f, copies); };
  };
  memory_bound_row("adamw (f32 12288x8192)", params * 28, copy_gbs, adamw({}));
  memory_bound_row("adamw + bf16 copy", params * 30, copy_gbs, adamw({.bf16 = &bf16}));
  memory_bound_row("adamw + fp8 W, Wt (fused)", params * 28 + fp8_bytes, copy_gbs, adamw({.fp8 = &fp8}));
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, small_t;
  bool decode_only = false, grouped = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--reps" && i + 1 < argc) g_reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--decode-only") decode_only = true;
    else if (a == "--small-t" && i + 1 < argc) small_t = argv[++i];
    else if (a == "--exact") set_exact_forward(true);
    else if (a == "--grouped") grouped = true;
    else {
      std::fprintf(stderr, "bench_gemm: unknown argument '%s'\nusage: bench_gemm [--json out.json] [--reps N] "
                   "[--decode-only] [--small-t MODEL:LINEAR:T] [--exact] [--grouped]\n", a.c_str());
      return 2;
    }
  }
  try {
    const SmallTShape one_shape = small_t.empty() ? SmallTShape{} : parse_small_t(small_t);
    if (!cuda_device_available()) {
      std::fprintf(stderr, "bench_gemm: no CUDA device\n");
      return 1;
    }
    cudaDeviceProp prop;
    LOCKSTEP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
    if (one_shape.linear) {
      bench_one_small_t(one_shape);
      return 0;
    }
    if (grouped) {
      bench_grouped();
    } else {
      if (!decode_only) bench_memory_bound();
      bench_decode();
      if (!decode_only) bench_training(8192);
    }
    if (!json_path.empty()) {
      std::ofstream(json_path) << "{\"device\": \"" << prop.name << "\", \"results\": [\n" << json_rows << "\n]}\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm: %s\n", e.what());
    return 1;
  }
}
