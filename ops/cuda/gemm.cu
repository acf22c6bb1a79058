// ops/cuda/gemm.cu — the linear-layer GEMMs through cuBLASLt.
//
// Layout rules (cuBLASLt is column-major; our tensors are row-major, so a row-major [R, C] tensor
// is a column-major C×R matrix with leading dimension C):
//   FP8 must be "TN": A = weight-like operand stored k×m (op T), B = activation stored k×n (op N),
//   D bf16/f32 m×n (= row-major [n, m]). Scales: A BLK128x128_32F or VEC128_32F, B VEC128_32F
//   (layouts in numerics/quantize.h). bf16 also allows NN (DGrad) and NT (WGrad).
//
// Every distinct call shape gets a Plan (descriptors, layouts, algorithm from the heuristic),
// made once and cached; the hot path only sets the scale pointers and calls cublasLtMatmul.
// Each stream has its own workspace. When cuBLASLt has no algorithm for an odd token count, the
// activation is padded to a multiple of 16 tokens in a per-stream scratch buffer.
#include <cublasLt.h>

#include <compare>
#include <map>
#include <memory>
#include <mutex>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "ops/gemm_backends.h"

#define LOCKSTEP_CUBLAS_CHECK(call)                                                          \
  do {                                                                                       \
    cublasStatus_t lockstep_st_ = (call);                                                    \
    if (lockstep_st_ != CUBLAS_STATUS_SUCCESS)                                               \
      throw ::lockstep::Error(::lockstep::detail::concat("cuBLASLt error ",                  \
                                                         cublas_status_name(lockstep_st_),   \
                                                         " in ", #call, " at ", __FILE__,    \
                                                         ":", __LINE__));                    \
  } while (0)

namespace lockstep::cuda {

namespace {

// (cublasGetStatusString lives in libcublas, which we do not otherwise link.)
const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "NOT_SUPPORTED";
    default: return "UNKNOWN";
  }
}

constexpr size_t kWorkspaceBytes = 32u << 20;
constexpr int64_t kTokenPad = 16;
constexpr int kNoScale = -1;

struct MatmulShape {
  cublasOperation_t op_a, op_b;
  cudaDataType_t type_a, type_b, type_d;
  int64_t m, n, k, lda, ldb, ldd;
  int scale_a, scale_b;  // cublasLtMatmulMatrixScale_t, or kNoScale
  bool accumulate;
  int alignment;         // bytes every pointer is aligned to: 256 or 16
  auto operator<=>(const MatmulShape&) const = default;
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // false: cuBLASLt has no algorithm for this shape
};

struct StreamBuffers {
  void* workspace = nullptr;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

struct Context {
  std::mutex mutex;
  cublasLtHandle_t handle = nullptr;
  std::map<MatmulShape, Plan> plans;
  std::map<cudaStream_t, StreamBuffers> buffers;
  bool force_padding = false;
};

Context& context() {
  static Context* ctx = [] {
    auto* c = new Context;  // never freed: outlives every static that might run a GEMM
    LOCKSTEP_CUBLAS_CHECK(cublasLtCreate(&c->handle));
    return c;
  }();
  return *ctx;
}

template <class T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  LOCKSTEP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

// The scale pointers must be set before the heuristic query (cuBLASLt rejects block-scaled
// descriptors without them); each call sets its own afterwards.
Plan make_plan(cublasLtHandle_t handle, const MatmulShape& s, const float* scale_a,
               const float* scale_b) {
  Plan p;
  LOCKSTEP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, s.op_a);
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, s.op_b);
  if (s.scale_a != kNoScale) {
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32_t(s.scale_a));
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t(s.scale_b));
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, scale_a);
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scale_b);
  }
  const bool ta = s.op_a == CUBLAS_OP_T, tb = s.op_b == CUBLAS_OP_T;
  LOCKSTEP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, s.type_a, ta ? s.k : s.m, ta ? s.m : s.k, s.lda));
  LOCKSTEP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, s.type_b, tb ? s.n : s.k, tb ? s.k : s.n, s.ldb));
  LOCKSTEP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, s.type_d, s.m, s.n, s.ldd));

  cublasLtMatmulPreference_t pref;
  LOCKSTEP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t align = uint32_t(s.alignment);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &count);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && count > 0) {
    p.algo = result.algo;
    p.found = true;
  } else if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) {
    LOCKSTEP_CUBLAS_CHECK(st);
  }
  return p;
}

int alignment_of(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 256) return 16;
  return 256;
}

void check_aligned16(const Tensor& t, const char* what) {
  LOCKSTEP_CHECK(reinterpret_cast<uintptr_t>(t.data()) % 16 == 0, what,
                 ": cuBLASLt needs 16-byte aligned operands, got ", t.describe(), " at ", t.data());
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::f32: return CUDA_R_32F;
    case DType::e4m3: return CUDA_R_8F_E4M3;
    default: fail(detail::concat("GEMM: unsupported dtype ", dtype_name(t)));
  }
}

// Finds (or makes) the plan; nullptr when cuBLASLt has no algorithm for the shape.
const Plan* plan_for(const MatmulShape& s, const float* scale_a = nullptr,
                     const float* scale_b = nullptr) {
  Context& ctx = context();
  std::lock_guard lock(ctx.mutex);
  if (ctx.force_padding && s.n % kTokenPad) return nullptr;
  auto it = ctx.plans.find(s);
  if (it == ctx.plans.end()) it = ctx.plans.emplace(s, make_plan(ctx.handle, s, scale_a, scale_b)).first;
  return it->second.found ? &it->second : nullptr;
}

StreamBuffers& buffers_for(cudaStream_t stream) {
  Context& ctx = context();
  std::lock_guard lock(ctx.mutex);
  StreamBuffers& b = ctx.buffers[stream];
  if (!b.workspace) LOCKSTEP_CUDA_CHECK(cudaMalloc(&b.workspace, kWorkspaceBytes));
  return b;
}

// Grow-only scratch of the stream (for token padding).
char* scratch_for(cudaStream_t stream, size_t bytes) {
  StreamBuffers& b = buffers_for(stream);
  if (b.scratch_bytes < bytes) {
    LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));  // the old buffer may still be in use
    cudaFree(b.scratch);
    LOCKSTEP_CUDA_CHECK(cudaMalloc(&b.scratch, bytes));
    b.scratch_bytes = bytes;
  }
  return static_cast<char*>(b.scratch);
}

void run(const Plan& p, const MatmulShape& s, const void* a, const void* b, void* d,
         const float* scale_a, const float* scale_b) {
  cudaStream_t stream = current_stream();
  if (s.scale_a != kNoScale) {
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, scale_a);
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scale_b);
  }
  const float alpha = 1.0f, beta = s.accumulate ? 1.0f : 0.0f;
  LOCKSTEP_CUBLAS_CHECK(cublasLtMatmul(context().handle, p.desc, &alpha, a, p.a, b, p.b, &beta, d,
                                       p.d, d, p.d, &p.algo, buffers_for(stream).workspace,
                                       kWorkspaceBytes, stream));
}

[[noreturn]] void no_algorithm(const MatmulShape& s) {
  fail(detail::concat("cuBLASLt has no algorithm for GEMM m=", s.m, " n=", s.n, " k=", s.k));
}

// A GEMM whose n is the token count T of a row-major activation `act` [T, k] (with optional
// VEC128 scales [k/128, T]) and whose output is row-major [T, m]. Runs natively when cuBLASLt can,
// else on copies padded to a multiple of kTokenPad tokens.
void run_token_gemm(MatmulShape s, const void* weight, const float* weight_scales, const Tensor& act,
                    const Tensor* act_scales, Tensor& out) {
  const int64_t T = s.n;
  if (T == 0) return;
  s.alignment = alignment_of({weight, act.data(), out.data()});
  const float* act_scale_ptr = act_scales ? act_scales->data_as<float>() : nullptr;
  if (const Plan* p = plan_for(s, weight_scales, act_scale_ptr)) {
    return run(*p, s, weight, act.data(), out.data(), weight_scales, act_scale_ptr);
  }
  const int64_t Tp = round_up(T, kTokenPad), k = s.k, m = s.m;
  const size_t act_bytes = size_t(round_up(Tp * k * int64_t(dtype_size(act.dtype())), 256));
  const size_t scale_bytes = size_t(round_up((k / 128) * Tp * 4, 256));
  const size_t out_bytes = size_t(Tp * m) * dtype_size(out.dtype());
  cudaStream_t stream = current_stream();
  char* base = scratch_for(stream, act_bytes + scale_bytes + out_bytes);
  char *pact = base, *pscale = base + act_bytes, *pout = pscale + scale_bytes;
  LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(pact, 0, act_bytes + scale_bytes, stream));
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(pact, act.data(), act.nbytes(), cudaMemcpyDeviceToDevice, stream));
  if (act_scales)
    LOCKSTEP_CUDA_CHECK(cudaMemcpy2DAsync(pscale, size_t(Tp) * 4, act_scales->data(), size_t(T) * 4,
                                          size_t(T) * 4, size_t(k / 128), cudaMemcpyDeviceToDevice, stream));
  s.n = Tp;
  s.alignment = alignment_of({weight, pout});
  const Plan* p = plan_for(s, weight_scales, reinterpret_cast<const float*>(pscale));
  if (!p) no_algorithm(s);
  run(*p, s, weight, pact, pout, weight_scales, reinterpret_cast<const float*>(pscale));
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(out.data(), pout, out.nbytes(), cudaMemcpyDeviceToDevice, stream));
}

}  // namespace

void gemm_force_token_padding(bool on) { context().force_padding = on; }

void gemm_fprop_bf16(Tensor& y, const Tensor& x, const Tensor& w) {
  check_aligned16(x, "gemm_fprop: x");
  check_aligned16(w, "gemm_fprop: w");
  const int64_t T = x.dim(0), K = x.dim(1), N = w.dim(0);
  MatmulShape s{CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_16BF, cuda_type(y.dtype()),
                N, T, K, K, K, N, kNoScale, kNoScale, false, 0};
  run_token_gemm(s, w.data(), nullptr, x, nullptr, y);
}

void gemm_dgrad_bf16(Tensor& dx, const Tensor& dy, const Tensor& w) {
  check_aligned16(dy, "gemm_dgrad: dy");
  check_aligned16(w, "gemm_dgrad: w");
  const int64_t T = dy.dim(0), N = dy.dim(1), K = w.dim(1);
  MatmulShape s{CUBLAS_OP_N, CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_16BF, cuda_type(dx.dtype()),
                K, T, N, K, N, K, kNoScale, kNoScale, false, 0};
  run_token_gemm(s, w.data(), nullptr, dy, nullptr, dx);
}

void gemm_wgrad_bf16(Tensor& dw, const Tensor& dy, const Tensor& x, bool accumulate) {
  check_aligned16(dy, "gemm_wgrad: dy");
  check_aligned16(x, "gemm_wgrad: x");
  const int64_t T = dy.dim(0), N = dy.dim(1), K = x.dim(1);
  if (T == 0) {
    if (!accumulate) dw.fill_bytes(0);
    return;
  }
  MatmulShape s{CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F,
                K, N, T, K, N, K, kNoScale, kNoScale, accumulate,
                alignment_of({dy.data(), x.data(), dw.data()})};
  const Plan* p = plan_for(s);
  if (!p) no_algorithm(s);
  run(*p, s, x.data(), dy.data(), dw.data(), nullptr, nullptr);
}

void gemm_fp8(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight) {
  check_aligned16(act.data, "fp8 gemm: activation");
  check_aligned16(weight.data, "fp8 gemm: weight");
  const int64_t T = act.rows(), K = act.cols(), M = weight.rows();
  MatmulShape s{CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, cuda_type(out.dtype()),
                M, T, K, K, K, M, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, false, 0};
  run_token_gemm(s, weight.data.data(), weight.scales.data_as<float>(), act.data, &act.scales, out);
}

void gemm_wgrad_fp8(Tensor& dw, const Fp8Rows& dy_t, const Fp8Rows& x_t, bool accumulate) {
  check_aligned16(dy_t.data, "gemm_wgrad: dy_t");
  check_aligned16(x_t.data, "gemm_wgrad: x_t");
  const int64_t N = dy_t.rows(), K = x_t.rows(), Tp = x_t.cols();
  MatmulShape s{CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_32F,
                K, N, Tp, Tp, Tp, K, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
                CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, accumulate,
                alignment_of({dy_t.data.data(), x_t.data.data(), dw.data()})};
  const Plan* p = plan_for(s, x_t.scales.data_as<float>(), dy_t.scales.data_as<float>());
  if (!p) no_algorithm(s);
  run(*p, s, x_t.data.data(), dy_t.data.data(), dw.data(), x_t.scales.data_as<float>(),
      dy_t.scales.data_as<float>());
}

}  // namespace lockstep::cuda
