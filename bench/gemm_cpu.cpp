// bench/gemm_cpu — GFLOP/s of the CPU GEMMs (FProp, DGrad, WGrad) in the bf16, f32 and fp8 recipes
// at small-model shapes (T = 4096 tokens), and FProp at decode shapes. The thread count is
// OpenMP's (OMP_NUM_THREADS). fp8 times exclude quantization.
// Usage: bench_gemm_cpu [--json out.json] [--tokens T]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "numerics/quantize.h"
#include "ops/gemm.h"

using namespace lockstep;

namespace {

// The fastest of the timed calls after one warm-up (at least 3, more while under 0.3 s in total):
// on a machine shared with other work the minimum is the stable estimate.
double time_s(const std::function<void()>& fn) {
  using clock = std::chrono::steady_clock;
  fn();
  std::vector<double> s;
  double total = 0;
  while (s.size() < 3 || (total < 0.3 && s.size() < 50)) {
    const auto start = clock::now();
    fn();
    s.push_back(std::chrono::duration<double>(clock::now() - start).count());
    total += s.back();
  }
  return *std::min_element(s.begin(), s.end());
}

Tensor random(Shape shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const float v = (float(s >> 40) / float(1 << 24) - 0.5f) * 3.4641f;  // uniform, unit variance
    if (dtype == DType::bf16)
      t.data_as<bf16>()[i] = float_to_bf16(v);
    else
      t.data_as<float>()[i] = v;
  }
  return t;
}

struct Linear {
  const char* name;
  int64_t n, k;
};

const Linear kLinears[] = {
    {"square", 256, 256}, {"qkv", 768, 256},      {"up", 1024, 256},       {"down", 256, 768},
    {"down", 256, 1024},  {"square", 1024, 1024}, {"lm_chunk", 4096, 256},
};

std::string json_rows;
void add_json(const std::string& row) { json_rows += (json_rows.empty() ? "  " : ",\n  ") + row; }

// The three GEMMs of one linear layer in one recipe, in GFLOP/s.
struct Times {
  double fprop, dgrad, wgrad;
};

Times bench_linear(int64_t T, int64_t N, int64_t K, const char* recipe) {
  const std::string r = recipe;
  if (r == "fp8") {
    Tensor x = random({T, K}, DType::bf16), w = random({N, K}, DType::f32),
           dy = random({T, N}, DType::bf16);
    Fp8Rows qx = Fp8Rows::empty(T, K, Device::cpu),
            qxt = Fp8Rows::empty_columnwise(T, K, Device::cpu);
    Fp8Rows qdy = Fp8Rows::empty(T, N, Device::cpu),
            qdyt = Fp8Rows::empty_columnwise(T, N, Device::cpu);
    Fp8Weight qw = Fp8Weight::empty(N, K, Device::cpu);
    quantize_rows_and_columns(qx, qxt, x);
    quantize_rows_and_columns(qdy, qdyt, dy);
    quantize_weight(qw, w);
    Tensor y = Tensor::empty({T, N}, DType::bf16), dx = Tensor::empty({T, K}, DType::bf16);
    Tensor dw = Tensor::zeros({N, K}, DType::f32);
    return {time_s([&] { gemm_fprop(y, qx, qw); }), time_s([&] { gemm_dgrad(dx, qdy, qw); }),
            time_s([&] { gemm_wgrad(dw, qdyt, qxt, true); })};
  }
  const DType dt = r == "f32" ? DType::f32 : DType::bf16;
  Tensor x = random({T, K}, dt), w = random({N, K}, dt), dy = random({T, N}, dt);
  Tensor y = Tensor::empty({T, N}, dt), dx = Tensor::empty({T, K}, dt);
  Tensor dw = Tensor::zeros({N, K}, DType::f32);
  return {time_s([&] { gemm_fprop(y, x, w); }), time_s([&] { gemm_dgrad(dx, dy, w); }),
          time_s([&] { gemm_wgrad(dw, dy, x, true); })};
}

void bench_training(int64_t T) {
  const char* recipes[] = {"bf16", "f32", "fp8"};
  std::printf("\nTraining GEMMs, T = %ld tokens, GFLOP/s (wgrad accumulates into fp32 dW)\n",
              long(T));
  std::printf("%-9s %5s %5s |", "linear", "N", "K");
  for (const char* r : recipes) std::printf(" %5s fprop  dgrad  wgrad |", r);
  std::printf("\n");
  for (const Linear& l : kLinears) {
    std::printf("%-9s %5ld %5ld |", l.name, long(l.n), long(l.k));
    const double flops = 2.0 * double(T) * double(l.n) * double(l.k);
    for (const char* r : recipes) {
      const Times t = bench_linear(T, l.n, l.k, r);
      const double g[3] = {flops / t.fprop / 1e9, flops / t.dgrad / 1e9, flops / t.wgrad / 1e9};
      std::printf("       %6.1f %6.1f %6.1f |", g[0], g[1], g[2]);
      std::fflush(stdout);
      const char* ops[3] = {"fprop", "dgrad", "wgrad"};
      const double secs[3] = {t.fprop, t.dgrad, t.wgrad};
      for (int i = 0; i < 3; ++i)
        add_json("{\"kind\": \"train\", \"recipe\": \"" + std::string(r) + "\", \"op\": \"" +
                 ops[i] + "\", \"T\": " + std::to_string(T) + ", \"N\": " + std::to_string(l.n) +
                 ", \"K\": " + std::to_string(l.k) + ", \"ms\": " + std::to_string(secs[i] * 1e3) +
                 ", \"gflops\": " + std::to_string(g[i]) + "}");
    }
    std::printf("\n");
  }
}

void bench_decode() {
  std::printf("\nDecode-shape FProp: microseconds and GFLOP/s\n");
  std::printf("%-9s %5s %5s %4s | %9s %9s | %7s %7s\n", "linear", "N", "K", "T", "bf16 us",
              "fp8 us", "bf16 GF", "fp8 GF");
  for (const Linear& l : {Linear{"up", 1024, 256}, Linear{"lm_chunk", 4096, 256}}) {
    const int64_t N = l.n, K = l.k;
    Tensor w16 = random({N, K}, DType::bf16);
    Fp8Weight qw = Fp8Weight::empty(N, K, Device::cpu);
    quantize_weight(qw, w16);
    for (int64_t T : {1, 16, 64}) {
      Tensor x = random({T, K}, DType::bf16), y = Tensor::empty({T, N}, DType::bf16);
      Fp8Rows qx = Fp8Rows::empty(T, K, Device::cpu);
      quantize_rows(qx, x);
      const double a = time_s([&] { gemm_fprop(y, x, w16); }),
                   b = time_s([&] { gemm_fprop(y, qx, qw); });
      const double flops = 2.0 * double(T) * double(N) * double(K);
      std::printf("%-9s %5ld %5ld %4ld | %9.1f %9.1f | %7.1f %7.1f\n", l.name, long(N), long(K),
                  long(T), a * 1e6, b * 1e6, flops / a / 1e9, flops / b / 1e9);
      add_json("{\"kind\": \"decode\", \"T\": " + std::to_string(T) +
               ", \"N\": " + std::to_string(N) + ", \"K\": " + std::to_string(K) +
               ", \"bf16_us\": " + std::to_string(a * 1e6) +
               ", \"fp8_us\": " + std::to_string(b * 1e6) + "}");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int64_t tokens = 4096;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else if (a == "--tokens" && i + 1 < argc)
      tokens = std::max(1L, std::atol(argv[++i]));
    else {
      std::fprintf(stderr,
                   "bench_gemm_cpu: unknown argument '%s'\n"
                   "usage: bench_gemm_cpu [--json out.json] [--tokens T]\n",
                   a.c_str());
      return 2;
    }
  }
  try {
    std::printf("CPU GEMMs, %d OpenMP threads, best of >= 3 runs\n", omp_get_max_threads());
    bench_decode();
    bench_training(tokens);
    if (!json_path.empty())
      std::ofstream(json_path) << "{\"device\": \"cpu\", \"threads\": " << omp_get_max_threads()
                               << ", \"results\": [\n"
                               << json_rows << "\n]}\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm_cpu: %s\n", e.what());
    return 1;
  }
}
