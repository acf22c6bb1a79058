// bench/attention — the CUDA attention kernels (ops/cuda/attention.cu): TFLOP/s of the packed
// causal training forward and backward at T = 8192 tokens (Qwen3-8B and Qwen3-1.7B heads), and the
// GB/s at which paged decode reads the KV cache against a measured device-to-device copy (batch 1
// to 128, contexts 1K to 64K, Qwen3-8B heads, block size 16), plus prefill chunks.
// FLOPs: forward 4·d·q_heads·Σ n(n+1)/2 (Q·Kᵀ and P·V over the causal half), backward 2.5× that
// (five products instead of two). Decode bytes: the K and V rows each sequence's context holds.
// Every timed call follows a 512 MiB memset, so the KV cache never sits in L2. Training attention
// calls the backend directly (ops/attention.cpp may dispatch it to cuDNN instead). Scratch
// (backward: dQ accumulator and row sums; split decode: partial outputs) comes from Tensor::empty
// inside the timed calls: the numbers assume the stream-ordered memory pool.
// Usage: bench_attention [--json out.json] [--reps N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/gpu_timing.h"
#include "core/cuda_check.h"
#include "ops/attention.h"
#include "ops/attention_backends.h"

using namespace lockstep;

namespace {

int g_reps = 20;
std::function<void()> g_flush_l2;  // main's bench::L2Flush

// Median milliseconds of `reps` calls after 3 warm-ups, L2 flushed before each.
double time_ms(const std::function<void()>& fn) { return bench::median_ms(fn, g_reps, g_flush_l2); }

Tensor random_bf16(Shape shape, uint64_t seed) {
  Tensor host = Tensor::empty(shape, DType::bf16);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < host.numel(); ++i) host.data_as<bf16>()[i] = float_to_bf16(normal(rng));
  return host.to(Device::cuda);
}

Tensor i32_device(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data_as<int32_t>());
  return t.to(Device::cuda);
}

std::string json_rows;
void add_json(const std::string& row) { json_rows += (json_rows.empty() ? "  " : ",\n  ") + row; }

struct Model {
  const char* name;
  HeadLayout layout;
};
const Model kModels[] = {{"qwen3-8b", {32, 8, 128}}, {"qwen3-1.7b", {16, 8, 128}}};

void bench_training() {
  const int64_t T = 8192;
  std::printf("\nPacked causal training attention, T = %ld tokens (TFLOP/s)\n", long(T));
  std::printf("%-11s %8s | %9s %8s | %9s %8s\n", "model", "seq len", "fwd ms", "fwd TF", "bwd ms", "bwd TF");
  for (const Model& m : kModels) {
    const HeadLayout& l = m.layout;
    const Tensor qkv = random_bf16({T, l.qkv_width()}, 1), dout = random_bf16({T, l.q_width()}, 2);
    Tensor out = Tensor::empty({T, l.q_width()}, DType::bf16, Device::cuda);
    Tensor lse = Tensor::empty({T, l.q_heads}, DType::f32, Device::cuda);
    Tensor dqkv = Tensor::empty({T, l.qkv_width()}, DType::bf16, Device::cuda);
    for (int64_t n : {1024, 2048, 4096, 8192}) {
      std::vector<int32_t> cu;
      for (int64_t t = 0; t <= T; t += n) cu.push_back(int32_t(t));
      const Tensor cu_g = i32_device(cu);
      const double flops = 4.0 * double(l.head_dim) * double(l.q_heads) * double(T / n) * double(n) * double(n + 1) / 2;
      const double fwd = time_ms([&] { cuda::attention_forward(out, lse, qkv, cu_g, l); });
      const double bwd = time_ms([&] { cuda::attention_backward(dqkv, dout, qkv, out, lse, cu_g, l); });
      std::printf("%-11s %8ld | %9.3f %8.0f | %9.3f %8.0f\n", m.name, long(n), fwd, flops / fwd / 1e9, bwd,
                  2.5 * flops / bwd / 1e9);
      add_json("{\"kind\": \"train\", \"model\": \"" + std::string(m.name) + "\", \"T\": " + std::to_string(T) +
               ", \"seq_len\": " + std::to_string(n) + ", \"fwd_ms\": " + std::to_string(fwd) + ", \"fwd_tflops\": " +
               std::to_string(flops / fwd / 1e9) + ", \"bwd_ms\": " + std::to_string(bwd) + ", \"bwd_tflops\": " +
               std::to_string(2.5 * flops / bwd / 1e9) + "}");
    }
  }
}

// `batch` sequences of `context` positions in a cache of exactly their blocks (shuffled), each
// with `rows` query rows at its end.
struct PagedSetup {
  Tensor qkv, tables, cu_q, lens, out;
  PagedKv cache;

  // cache_dtype: bf16, or e4m3 (the fp8 KV cache, with its scales).
  PagedSetup(const HeadLayout& l, int64_t batch, int64_t context, int64_t rows, int64_t block_size,
             DType cache_dtype = DType::bf16) {
    const int64_t per_seq = (context + block_size - 1) / block_size, blocks = batch * per_seq;
    std::vector<int32_t> order(static_cast<size_t>(blocks)), cu, len(static_cast<size_t>(batch), int32_t(context));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(1));
    for (int64_t s = 0; s <= batch; ++s) cu.push_back(int32_t(s * rows));
    const Shape cache_shape{blocks, block_size, l.kv_heads, l.head_dim};
    cache.k = Tensor::empty(cache_shape, cache_dtype, Device::cuda);
    cache.v = Tensor::empty(cache_shape, cache_dtype, Device::cuda);
    if (cache_dtype == DType::e4m3) {
      cache.k_scale = Tensor::empty({blocks, block_size, l.kv_heads}, DType::f32, Device::cuda);
      cache.v_scale = Tensor::empty({blocks, block_size, l.kv_heads}, DType::f32, Device::cuda);
    }
    // 0x3C bytes are finite in every dtype (bf16 ≈ 0.0115, e4m3 1.5, f32 ≈ 0.0115), and the kernels'
    // time does not depend on values.
    for (Tensor* t : {&cache.k, &cache.v, &cache.k_scale, &cache.v_scale})
      if (t->defined()) t->fill_bytes(0x3C);
    tables = i32_device(order).reshape({batch, per_seq});
    cu_q = i32_device(cu);
    lens = i32_device(len);
    qkv = random_bf16({batch * rows, l.qkv_width()}, 3);
    out = Tensor::empty({batch * rows, l.q_width()}, DType::bf16, Device::cuda);
  }
  double run_ms(const HeadLayout& l) {
    return time_ms([&] { attention_paged(out, qkv, cache, tables, cu_q, lens, l); });
  }
};

void bench_decode(double copy_gbs) {
  const Model& m = kModels[0];
  const HeadLayout& l = m.layout;
  std::printf("\nPaged decode (one row a sequence), %s heads, block size 16: GB/s of K and V read (e4m3: with "
              "their scales); device copy %.0f GB/s\n", m.name, copy_gbs);
  std::printf("%6s %8s %6s | %9s %9s %8s\n", "batch", "context", "cache", "us", "GB/s", "of copy");
  for (int64_t batch : {1, 8, 32, 64, 128})
    for (int64_t context : {1024, 4096, 16384, 65536})
      for (DType dtype : {DType::bf16, DType::e4m3}) {
        if (batch * context > (int64_t(1) << 21)) continue;  // 8 GiB of cache
        PagedSetup p(l, batch, context, 1, 16, dtype);
        const double ms = p.run_ms(l);
        const double bytes_per_head = dtype == DType::e4m3 ? double(l.head_dim) + 4 : double(l.head_dim) * 2;
        const double bytes = double(batch * context) * double(l.kv_heads) * bytes_per_head * 2;
        const double gbs = bytes / (ms * 1e-3) / 1e9;
        const char* name = dtype == DType::e4m3 ? "e4m3" : "bf16";
        std::printf("%6ld %8ld %6s | %9.1f %9.0f %7.0f%%\n", long(batch), long(context), name, ms * 1e3, gbs,
                    100 * gbs / copy_gbs);
        add_json("{\"kind\": \"decode\", \"model\": \"" + std::string(m.name) + "\", \"batch\": " +
                 std::to_string(batch) + ", \"context\": " + std::to_string(context) + ", \"cache\": \"" + name +
                 "\", \"ms\": " + std::to_string(ms) + ", \"gbs\": " + std::to_string(gbs) + ", \"copy_gbs\": " +
                 std::to_string(copy_gbs) + "}");
      }
}

void bench_prefill_chunks() {
  const Model& m = kModels[0];
  const HeadLayout& l = m.layout;
  std::printf("\nPaged prefill chunks (the last `rows` positions of one sequence), %s heads (TFLOP/s)\n", m.name);
  std::printf("%6s %8s | %9s %8s\n", "rows", "context", "us", "TF");
  for (const auto& [rows, context] : std::vector<std::pair<int64_t, int64_t>>{{512, 4096}, {512, 16384}, {2048, 2048}}) {
    PagedSetup p(l, 1, context, rows, 16);
    const double ms = p.run_ms(l);
    // Row i (of rows) attends context − rows + i + 1 keys.
    const double keys = double(rows) * double(context - rows) + double(rows) * double(rows + 1) / 2;
    const double tf = 4.0 * double(l.head_dim) * double(l.q_heads) * keys / (ms * 1e-3) / 1e12;
    std::printf("%6ld %8ld | %9.1f %8.0f\n", long(rows), long(context), ms * 1e3, tf);
    add_json("{\"kind\": \"prefill_chunk\", \"model\": \"" + std::string(m.name) + "\", \"rows\": " +
             std::to_string(rows) + ", \"context\": " + std::to_string(context) + ", \"ms\": " + std::to_string(ms) +
             ", \"tflops\": " + std::to_string(tf) + "}");
  }
}


}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--reps" && i + 1 < argc) g_reps = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "bench_attention: unknown argument '%s'\nusage: bench_attention [--json out.json] [--reps N]\n",
                   a.c_str());
      return 2;
    }
  }
  try {
    if (!cuda_device_available()) {
      std::fprintf(stderr, "bench_attention: no CUDA device\n");
      return 1;
    }
    cudaDeviceProp prop;
    LOCKSTEP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
    const bench::L2Flush flush;
    g_flush_l2 = flush.fn();
    const double copy_gbs = bench::copy_bandwidth_gbs(g_reps, g_flush_l2);
    bench_decode(copy_gbs);
    bench_prefill_chunks();
    bench_training();
    if (!json_path.empty()) {
      std::ofstream(json_path) << "{\"device\": \"" << prop.name << "\", \"results\": [\n" << json_rows << "\n]}\n";
      std::printf("\nwrote %s\n", json_path.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_attention: %s\n", e.what());
    return 1;
  }
  return 0;
}
