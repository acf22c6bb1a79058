// ops/cuda/gemm_bf16_grouped.cu — ops/gemm.h's gemm_bf16_grouped_fprop / _dgrad: the experts of a
// mixture-of-experts layer in one cuBLAS call, cublasGemmGroupedBatchedEx.
//
// What CUDA 13.0 (cuBLAS 13.1) offers for this: cuBLASLt has batches of one shape only (strided or
// pointer-array), no grouped matmul; cuBLAS's cublasGemmGroupedBatchedEx takes a shape per group
// and a matrix per problem, and runs bf16 operands with CUBLAS_COMPUTE_32F into a bf16 output (its
// documented type table has no f32 output for bf16 operands, hence bf16 only).
// Each expert with rows is one problem; experts with the same row count form one group (a group
// is one shape: transposes, m, n, k, leading dimensions). In cuBLAS's column-major terms, as in
// ops/cuda/gemm.cu: FProp y_eᵀ [N × n_e] = W_e (stored K × N, op T) · x_eᵀ (K × n_e); DGrad
// dx_eᵀ [K × n_e] = W_e (K × N, op N) · dy_eᵀ (N × n_e).
//
// The problems' matrix pointers must be in device memory: a table of them is built on the host
// from the offsets and copied on the current stream ahead of the call (which needs the host
// offsets anyway, for every group's n). So the call cannot be captured into a CUDA graph (the
// exact forward's FProp, a loop of the ordinary GEMMs, can).
//
// Checked by tests/gpu/test_gemm_gpu.cpp (Bf16GroupedGpu*); timed by `bench_gemm --grouped`.
#include <cublas_v2.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "ops/cuda/cublas_check.h"
#include "ops/forward_kernels.h"
#include "ops/gemm_backends.h"

namespace lockstep::cuda {

namespace {

struct Cublas {
  std::mutex mutex;  // a handle's stream is shared state: set and used under the lock
  cublasHandle_t handle = nullptr;
};

Cublas& cublas() {
  static Cublas* c = [] {
    auto* c = new Cublas;  // never freed: outlives every static that might run a GEMM
    LOCKSTEP_CUBLAS_CHECK(cublasCreate(&c->handle));
    return c;
  }();
  return *c;
}

}  // namespace

void gemm_bf16_grouped(Tensor& out, const Tensor& a, const std::vector<Tensor>& w, const std::vector<int64_t>& offsets,
                       bool dgrad, bool accumulate) {
  // Under the exact forward kernels (ops/forward_kernels.h) FProp is each expert's gemm_fprop of
  // its rows, one algorithm per weight shape at every T: the grouped call's kernels are cuBLAS's
  // pick for the whole call, so a row's sum could depend on the other experts' loads.
  if (!dgrad && exact_forward()) {
    for (size_t e = 0; e + 1 < offsets.size(); ++e) {
      if (offsets[e] == offsets[e + 1]) continue;
      Tensor rows = out.rows(offsets[e], offsets[e + 1]);
      gemm_fprop_bf16(rows, a.rows(offsets[e], offsets[e + 1]), w[e]);
    }
    return;
  }
  cudaStream_t stream = current_stream();
  cudaStreamCaptureStatus capture;
  LOCKSTEP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  LOCKSTEP_CHECK(capture == cudaStreamCaptureStatusNone,
                 "bf16 grouped GEMM: cannot run while a CUDA graph is captured (its pointer table and group "
                 "shapes are this call's host data)");
  // The experts with rows, by row count: one group each count.
  std::map<int64_t, std::vector<size_t>> by_rows;
  size_t problems = 0;
  for (size_t e = 0; e + 1 < offsets.size(); ++e)
    if (const int64_t n = offsets[e + 1] - offsets[e]; n > 0) by_rows[n].push_back(e), ++problems;
  if (problems == 0) return;

  const int64_t m = out.dim(1), k = a.dim(1), ldw = w.front().dim(1);
  const size_t groups = by_rows.size();
  std::vector<cublasOperation_t> op_w(groups, dgrad ? CUBLAS_OP_N : CUBLAS_OP_T), op_a(groups, CUBLAS_OP_N);
  std::vector<int64_t> ms(groups, m), ks(groups, k), ld_w(groups, ldw), ld_a(groups, k), ld_out(groups, m);
  std::vector<int64_t> ns, sizes;
  std::vector<float> alpha(groups, 1.0f), beta(groups, accumulate ? 1.0f : 0.0f);
  // The pointer table: every problem's weight, then its rows of a, then its rows of out.
  std::vector<void*> table(3 * problems);
  size_t p = 0;
  for (const auto& [n, experts] : by_rows) {
    ns.push_back(n);
    sizes.push_back(int64_t(experts.size()));
    for (const size_t e : experts) {
      table[p] = w[e].data();
      table[problems + p] = a.rows(offsets[e], offsets[e + 1]).data();
      table[2 * problems + p] = out.rows(offsets[e], offsets[e + 1]).data();
      for (size_t i = 0; i < 3; ++i)
        LOCKSTEP_CHECK(reinterpret_cast<uintptr_t>(table[i * problems + p]) % 16 == 0, "bf16 grouped GEMM: expert ", e,
                       "'s ", i == 0 ? "weight" : i == 1 ? "input rows" : "output rows",
                       " must start 16-byte aligned (K and N multiples of 8), got ", table[i * problems + p], " for ",
                       (i == 0 ? w[e] : i == 1 ? a : out).describe());
      ++p;
    }
  }
  Tensor device_table = Tensor::empty({int64_t(table.size())}, DType::i64, Device::cuda);
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(device_table.data(), table.data(), table.size() * sizeof(void*),
                                      cudaMemcpyHostToDevice, stream));
  void** pointers = static_cast<void**>(device_table.data());

  Cublas& c = cublas();
  std::lock_guard lock(c.mutex);
  LOCKSTEP_CUBLAS_CHECK(cublasSetStream(c.handle, stream));
  LOCKSTEP_CUBLAS_CHECK(cublasGemmGroupedBatchedEx_64(
      c.handle, op_w.data(), op_a.data(), ms.data(), ns.data(), ks.data(), alpha.data(), pointers, CUDA_R_16BF,
      ld_w.data(), pointers + problems, CUDA_R_16BF, ld_a.data(), beta.data(), pointers + 2 * problems, CUDA_R_16BF,
      ld_out.data(), int64_t(groups), sizes.data(), CUBLAS_COMPUTE_32F));
}

}  // namespace lockstep::cuda
