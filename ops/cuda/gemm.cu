// ops/cuda/gemm.cu — the linear-layer GEMMs through cuBLASLt.
//
// Layout rules (cuBLASLt is column-major; our tensors are row-major, so a row-major [R, C] tensor
// is a column-major C×R matrix with leading dimension C):
//   FP8 must be "TN": A = weight-like operand stored k×m (op T), B = activation stored k×n (op N),
//   D bf16/f32 m×n (= row-major [n, m]). Scales: A BLK128x128_32F or VEC128_32F, B VEC128_32F
//   (layouts in numerics/quantize.h). bf16 also allows NN (DGrad) and NT (WGrad).
//
// Every distinct call shape gets a Plan (descriptors, layouts, algorithm), made once and cached;
// the hot path only sets the scale pointers and calls cublasLtMatmul. Each stream has its own
// workspace. When cuBLASLt has no algorithm for an odd token count, the activation is padded to a
// multiple of 16 tokens in a per-stream scratch buffer. FP8 GEMMs of few tokens (decoding) may go
// to ops/cuda/gemm_fp8_small_t.cu instead: per shape, whichever of the two timed faster on its
// first call (gemm_set_fp8_small_t in ops/gemm_backends.h). Under the exact forward kernels
// (ops/forward_kernels.h) a bf16 FProp runs one algorithm per weight shape at every T
// (make_exact_plan) and fp8 FProp runs the batch-invariant GEMM (ops/cuda/gemm_fp8_small_t.h: the
// weight-streaming kernel, or at many tokens the pipelined one, ops/cuda/gemm_fp8_pipelined.h, with
// the same bits).
//
// Autotuning: the heuristic's first choice is often not the fastest kernel (block-scaled FP8
// WGrad in particular), so a plan times up to 17 candidates on its first call's operands and keeps
// the fastest (a one-time cost per shape, ~0.1–0.5 s at the largest training shapes).
// LOCKSTEP_GEMM_AUTOTUNE=0 takes the heuristic's first choice instead, and the small-T kernel for
// 1 .. 16 tokens (deterministic across runs; an autotuned pick may differ between runs when
// candidates time within noise of each other); LOCKSTEP_GEMM_AUTOTUNE=verbose prints each tuned
// plan's and small-T choice's timings, and the exact forward's algorithm of each weight shape.
// Make every shape's plan before capturing a CUDA graph: a plan first made during capture is not
// tuned, nor is the choice of the small-T kernel for a shape first seen then.
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <compare>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "ops/cuda/cublas_check.h"
#include "ops/cuda/gemm_fp8_small_t.h"
#include "ops/forward_kernels.h"
#include "ops/gemm_backends.h"

namespace lockstep::cuda {

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;       // cuBLAS's recommendation for Hopper
constexpr size_t kTuneWorkspaceBytes = 128u << 20;  // what autotune candidates may ask for
constexpr int kTuneCandidates = 16;
constexpr int kTuneReps = 5;
constexpr double kTuneMargin = 0.98;  // another candidate must beat the heuristic's by 2%
constexpr int64_t kTokenPad = 16;
constexpr int kNoScale = -1;
constexpr int kAutotune = -1;
// Untimed, the small-T kernel runs up to this many tokens: on an H200 it beats cuBLASLt clearly
// there (up to 2.7×) but loses some Qwen3 shapes at 32 and 64
// (docs/results/small_t_mma_vs_wgmma_h200_2026-11-21.txt).
constexpr int64_t kSmallTUntunedTokens = 16;

struct MatmulShape {
  cublasOperation_t op_a, op_b;
  cudaDataType_t type_a, type_b, type_d;
  int64_t m, n, k, lda, ldb, ldd;
  int scale_a, scale_b;  // cublasLtMatmulMatrixScale_t, or kNoScale
  bool accumulate;
  int alignment;         // bytes every pointer is aligned to: 256 or 16
  int choice = kAutotune;  // how the algorithm was picked (set by plan_for, see gemm_set_algo_choice)
  bool exact = false;      // bf16 FProp under the exact forward kernels (make_exact_plan)
  auto operator<=>(const MatmulShape&) const = default;
};

// An fp8 GEMM of gemm_fp8 (FProp, DGrad) as the small-T choice sees it.
struct SmallTShape {
  int64_t tokens, rows, k;
  DType out;
  auto operator<=>(const SmallTShape&) const = default;
};

// An algorithm and the workspace it needs. (A named type: nvcc 13.0 crashes on a std::vector of
// cuBLASLt's anonymous typedef structs under C++20.)
struct Candidate {
  cublasLtMatmulAlgo_t algo;
  size_t workspace_bytes;
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;  // what algo needs
  bool found = false;          // false: cuBLASLt has no algorithm for this shape
};

struct StreamBuffers {
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

struct Context {
  std::mutex mutex;
  cublasLtHandle_t handle = nullptr;
  std::map<MatmulShape, Plan> plans;
  std::map<cudaStream_t, StreamBuffers> buffers;
  bool force_padding = false;
  int choice = kAutotune;
  bool verbose = false;  // LOCKSTEP_GEMM_AUTOTUNE=verbose: one line per tuned plan on stderr
  int small_t = kFp8SmallTAuto;                // gemm_set_fp8_small_t
  std::map<SmallTShape, bool> small_t_picks;   // kFp8SmallTAuto: true = the small-T kernel
  std::map<MatmulShape, std::optional<Candidate>> exact_algorithms;  // by weight shape (make_exact_plan)
};

Context& context() {
  static Context* ctx = [] {
    auto* c = new Context;  // never freed: outlives every static that might run a GEMM
    LOCKSTEP_CUBLAS_CHECK(cublasLtCreate(&c->handle));
    const char* env = std::getenv("LOCKSTEP_GEMM_AUTOTUNE");
    const std::string_view mode = env ? env : "";
    if (mode == "0") c->choice = 0;
    c->verbose = mode == "verbose";
    return c;
  }();
  return *ctx;
}

template <class T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  LOCKSTEP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

size_t element_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF ? 2 : 1; }

// The operands of one call: what autotuning runs the candidates on (its output goes to scratch).
struct Operands {
  const void* a;
  const void* b;
  const float* scale_a;
  const float* scale_b;
};

cublasStatus_t matmul(cublasLtHandle_t handle, const Plan& p, const cublasLtMatmulAlgo_t& algo,
                      const MatmulShape& s, const void* a, const void* b, void* d, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream) {
  const float alpha = 1.0f, beta = s.accumulate ? 1.0f : 0.0f;
  return cublasLtMatmul(handle, p.desc, &alpha, a, p.a, b, p.b, &beta, d, p.d, d, p.d, &algo, workspace,
                        workspace_bytes, stream);
}

// Split-K partial sums kept in fp32 in the workspace and reduced in a fixed order (COMPUTE_TYPE)
// are what we ask for: in-place reduction (INPLACE) accumulates in the output type in arrival
// order, and OUTPUT_TYPE rounds every partial sum to the output type (bf16) — less precise, and
// INPLACE not reproducible. Algorithms without split-K pass any mask.
constexpr uint32_t kReductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;

// Up to `count` algorithms of the heuristic, best estimate first, needing at most `workspace` bytes.
// (FAST_ACCUM is left off: with 1×128/128×128 scales the kernels promote every 128-deep K block
// anyway, and PyTorch rejects fast accumulation with block scaling.)
std::vector<Candidate> heuristic(cublasLtHandle_t handle, const Plan& p, const MatmulShape& s,
                                 size_t workspace, int count, uint32_t reductions = kReductions) {
  cublasLtMatmulPreference_t pref;
  LOCKSTEP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = workspace;
  const uint32_t align = uint32_t(s.alignment);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions,
                                       sizeof(reductions));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates];
  count = std::min(count, kTuneCandidates);
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.d, p.d, pref, count, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) LOCKSTEP_CUBLAS_CHECK(st);
  std::vector<Candidate> list;
  for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) list.push_back({results[i].algo, results[i].workspaceSize});
  return list;
}

// Candidate 0 is the heuristic's first choice within the default workspace (what a plan took
// before autotuning, with any reduction scheme if there is no other); unless only that one is
// wanted, the heuristic's next best follow, with a larger workspace allowed, without repeats.
std::vector<Candidate> candidates(cublasLtHandle_t handle, const Plan& p, const MatmulShape& s) {
  auto list = heuristic(handle, p, s, kWorkspaceBytes, 1);
  if (list.empty()) list = heuristic(handle, p, s, kWorkspaceBytes, 1, CUBLASLT_REDUCTION_SCHEME_MASK);
  if (s.choice == 0) return list;
  for (const auto& r : heuristic(handle, p, s, kTuneWorkspaceBytes, kTuneCandidates)) {
    const bool seen = std::any_of(list.begin(), list.end(), [&](const Candidate& c) {
      return std::memcmp(&c.algo, &r.algo, sizeof(r.algo)) == 0;
    });
    if (!seen) list.push_back(r);
  }
  return list;
}

std::string describe(const Candidate& c) {
  auto config = [&](cublasLtMatmulAlgoConfigAttributes_t attr) {
    size_t size = 0;  // cuBLASLt wants the attribute's exact size (2 or 4 bytes here)
    uint64_t v = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&c.algo, attr, nullptr, 0, &size);
    if (size <= sizeof(v)) cublasLtMatmulAlgoConfigGetAttribute(&c.algo, attr, &v, size, &size);
    return v;  // little-endian: the low bytes hold the value
  };
  return detail::concat("id ", config(CUBLASLT_ALGO_CONFIG_ID), " tile ", config(CUBLASLT_ALGO_CONFIG_TILE_ID),
                        " stages ", config(CUBLASLT_ALGO_CONFIG_STAGES_ID), " cluster ",
                        config(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), " splitk ",
                        config(CUBLASLT_ALGO_CONFIG_SPLITK_NUM), " ws ", c.workspace_bytes >> 20, " MiB");
}

// Milliseconds per call of `call` (false: it failed) on the current stream: one warm-up call, then
// the mean of kTuneReps calls, each timed alone after an untimed `before_each`; infinity when a call
// fails. The calls are queued back to back, with one synchronization at the end: never while the
// stream is being captured.
float per_call_ms(const std::function<bool()>& call, const std::function<void()>& before_each = {}) {
  cudaStream_t stream = current_stream();
  cudaEvent_t events[2 * kTuneReps];  // start, stop of each call
  for (cudaEvent_t& e : events) LOCKSTEP_CUDA_CHECK(cudaEventCreate(&e));
  bool ok = call();
  for (int r = 0; r < kTuneReps && ok; ++r) {
    if (before_each) before_each();
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(events[2 * r], stream));
    ok = call();
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(events[2 * r + 1], stream));
  }
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
  float total = 0;
  for (int r = 0; r < kTuneReps && ok; ++r) {
    float ms = 0;
    LOCKSTEP_CUDA_CHECK(cudaEventElapsedTime(&ms, events[2 * r], events[2 * r + 1]));
    total += ms;
  }
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  if (!ok) (void)cudaGetLastError();  // a launch error cuBLASLt reported is not sticky: clear it
  return ok ? total / kTuneReps : INFINITY;
}

bool capturing() {
  cudaStreamCaptureStatus capture;
  LOCKSTEP_CUDA_CHECK(cudaStreamIsCapturing(current_stream(), &capture));
  return capture != cudaStreamCaptureStatusNone;
}

// Index of the fastest candidate on the call's own operands: each runs twice kTuneReps times
// (after a warm-up) on the current stream into a scratch output — never the caller's, which
// WGrad accumulates into — and keeps its best mean. The heuristic's first choice stays unless
// another beats it by the margin, so timing noise does not flip the choice from run to run.
// Not while the stream is being captured into a graph (timing needs synchronization), nor when
// the scratch does not fit in memory: then candidate 0.
size_t fastest(cublasLtHandle_t handle, const Plan& p, const MatmulShape& s,
               const std::vector<Candidate>& list, const Operands& in, bool verbose) {
  if (list.size() < 2 || capturing()) return 0;
  cudaStream_t stream = current_stream();
  const size_t out_bytes = size_t(s.ldd) * size_t(s.n) * element_bytes(s.type_d);
  char* scratch = nullptr;
  if (cudaMalloc(&scratch, kTuneWorkspaceBytes + out_bytes) != cudaSuccess) {
    (void)cudaGetLastError();  // out of memory is not sticky: clear it
    return 0;
  }
  void* out = scratch + kTuneWorkspaceBytes;
  LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(out, 0, out_bytes, stream));  // accumulating GEMMs read it
  // Candidate i, or infinity when cuBLASLt cannot run it after all.
  auto candidate_ms = [&](size_t i) {
    return per_call_ms([&] {
      return matmul(handle, p, list[i].algo, s, in.a, in.b, out, scratch, kTuneWorkspaceBytes, stream) ==
             CUBLAS_STATUS_SUCCESS;
    });
  };
  std::vector<float> ms(list.size(), INFINITY);
  for (int round = 0; round < 2; ++round)
    for (size_t i = 0; i < list.size(); ++i) ms[i] = std::min(ms[i], candidate_ms(i));
  LOCKSTEP_CUDA_CHECK(cudaFree(scratch));
  const size_t best = size_t(std::min_element(ms.begin(), ms.end()) - ms.begin());
  const size_t pick = ms[best] < kTuneMargin * ms[0] ? best : 0;
  if (verbose)
    std::fprintf(stderr,
                 "gemm autotune m=%ld n=%ld k=%ld%s: %zu candidates, heuristic %.4f ms (%s), "
                 "pick #%zu %.4f ms (%s)\n",
                 long(s.m), long(s.n), long(s.k), s.accumulate ? " accumulate" : "", list.size(), ms[0],
                 describe(list[0]).c_str(), pick, ms[pick], describe(list[pick]).c_str());
  return pick;
}

// A plan's descriptors and layouts, without its algorithm. The scale pointers must be set before
// the heuristic query (cuBLASLt rejects block-scaled descriptors without them); each call sets its
// own afterwards.
Plan describe_plan(const MatmulShape& s, const Operands& in) {
  Plan p;
  LOCKSTEP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, s.op_a);
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, s.op_b);
  if (s.scale_a != kNoScale) {
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32_t(s.scale_a));
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t(s.scale_b));
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, in.scale_a);
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, in.scale_b);
  }
  const bool ta = s.op_a == CUBLAS_OP_T, tb = s.op_b == CUBLAS_OP_T;
  LOCKSTEP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, s.type_a, ta ? s.k : s.m, ta ? s.m : s.k, s.lda));
  LOCKSTEP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, s.type_b, tb ? s.n : s.k, tb ? s.k : s.n, s.ldb));
  LOCKSTEP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, s.type_d, s.m, s.n, s.ldd));
  return p;
}

Plan make_plan(cublasLtHandle_t handle, const MatmulShape& s, const Operands& in, bool verbose) {
  Plan p = describe_plan(s, in);
  const auto list = candidates(handle, p, s);
  const size_t pick = s.choice == kAutotune ? fastest(handle, p, s, list, in, verbose) : size_t(s.choice);
  if (pick < list.size()) {
    p.algo = list[pick].algo;
    p.workspace_bytes = list[pick].workspace_bytes;
    p.found = true;
  }
  return p;
}

// The exact forward kernels' bf16 FProp runs one algorithm for a weight shape at every token count
// T, so that a token's row sums its K terms in one order whether the GEMM has 1 row (a decode step,
// or the rollout's logits of one sequence) or 8192 (a training micro-batch). The heuristic and
// the autotuning above choose per shape (T included), and kernels of other tiles, MMA instructions
// or in-CTA K slices may order a row's sum differently; split-K kernels cut it by a grid that grows
// with T. So the algorithm is the first of the heuristic's candidates for kExactPlanTokens tokens
// (not timed: a timed pick may change from run to run) among kernels that reduce in no second pass
// (no reduction scheme) which cublasLtMatmulAlgoCheck accepts, within the default workspace, at
// every token count of kExactCheckTokens; 16-byte alignment assumed. A T it does not run has no
// plan, and run_token_gemm pads it, which adds rows, not terms to a row's sum. (The heuristic's
// first choice at 256 tokens with no workspace was rejected at other token counts on an H200.)
constexpr int64_t kExactPlanTokens = 4096;
constexpr int64_t kExactCheckTokens[] = {16, 64, 256, 4096, 8192};

bool runs_at(cublasLtHandle_t handle, const MatmulShape& s, const Operands& in, const Candidate& c) {
  Plan p = describe_plan(s, in);
  cublasLtMatmulHeuristicResult_t check{};
  const bool ok = cublasLtMatmulAlgoCheck(handle, p.desc, p.a, p.b, p.d, p.d, &c.algo, &check) ==
                      CUBLAS_STATUS_SUCCESS && check.workspaceSize <= kWorkspaceBytes;
  for (cublasLtMatrixLayout_t l : {p.a, p.b, p.d}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(p.desc);
  return ok;
}

std::optional<Candidate> exact_algorithm(cublasLtHandle_t handle, const MatmulShape& s,
                                         const Operands& in) {
  MatmulShape chosen_for = s;
  chosen_for.n = kExactPlanTokens;
  chosen_for.alignment = 16;
  Plan p = describe_plan(chosen_for, in);
  const auto list = heuristic(handle, p, chosen_for, kWorkspaceBytes, kTuneCandidates,
                              CUBLASLT_REDUCTION_SCHEME_NONE);
  for (cublasLtMatrixLayout_t l : {p.a, p.b, p.d}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(p.desc);
  for (const Candidate& c : list) {
    bool everywhere = true;
    for (const int64_t t : kExactCheckTokens) {
      MatmulShape at = chosen_for;
      at.n = t;
      everywhere = everywhere && runs_at(handle, at, in, c);
    }
    if (everywhere) return c;
  }
  return std::nullopt;
}

// s's plan with the algorithm of its weight shape (exact_algorithm, made once per shape and kept
// in `chosen`; printed when `verbose`): not found when there is none, or when it does not run at
// s's T.
Plan make_exact_plan(cublasLtHandle_t handle, const MatmulShape& s, const Operands& in,
                     std::map<MatmulShape, std::optional<Candidate>>& chosen, bool verbose) {
  MatmulShape key = s;  // the weight shape: any T, alignment and algorithm choice
  key.n = 0;
  key.alignment = 0;
  key.choice = kAutotune;
  auto it = chosen.find(key);
  if (it == chosen.end()) {
    it = chosen.emplace(key, exact_algorithm(handle, s, in)).first;
    if (verbose)
      std::fprintf(stderr, "gemm exact m=%ld k=%ld: %s\n", long(s.m), long(s.k),
                   it->second ? describe(*it->second).c_str() : "no algorithm");
  }
  Plan p = describe_plan(s, in);
  if (!it->second) return p;
  cublasLtMatmulHeuristicResult_t check{};
  if (cublasLtMatmulAlgoCheck(handle, p.desc, p.a, p.b, p.d, p.d, &it->second->algo, &check) ==
          CUBLAS_STATUS_SUCCESS && check.workspaceSize <= kWorkspaceBytes) {
    p.algo = it->second->algo;
    p.workspace_bytes = check.workspaceSize;
    p.found = true;
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

// Finds (or makes) the plan; nullptr when cuBLASLt has no algorithm for the shape. `in` is only
// read when the plan is made (heuristic query, autotuning).
const Plan* plan_for(MatmulShape s, const Operands& in) {
  Context& ctx = context();
  std::lock_guard lock(ctx.mutex);
  if (ctx.force_padding && s.n % kTokenPad) return nullptr;
  s.choice = ctx.choice;
  auto it = ctx.plans.find(s);
  if (it == ctx.plans.end())
    it = ctx.plans.emplace(s, s.exact ? make_exact_plan(ctx.handle, s, in, ctx.exact_algorithms, ctx.verbose)
                                      : make_plan(ctx.handle, s, in, ctx.verbose)).first;
  return it->second.found ? &it->second : nullptr;
}

// Grow-only device buffer of a stream; the old one may still be in use by queued work.
void grow(void*& buffer, size_t& bytes, size_t need, cudaStream_t stream) {
  if (bytes >= need) return;
  if (buffer) {
    LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaFree(buffer);
    buffer = nullptr;
  }
  LOCKSTEP_CUDA_CHECK(cudaMalloc(&buffer, need));
  bytes = need;
}

// The stream's cuBLASLt workspace: at least the default size, more if a tuned plan needs it.
std::pair<void*, size_t> workspace_for(cudaStream_t stream, size_t need) {
  Context& ctx = context();
  std::lock_guard lock(ctx.mutex);
  StreamBuffers& b = ctx.buffers[stream];
  grow(b.workspace, b.workspace_bytes, std::max(need, kWorkspaceBytes), stream);
  return {b.workspace, b.workspace_bytes};
}

// The stream's scratch (for token padding).
char* scratch_for(cudaStream_t stream, size_t bytes) {
  Context& ctx = context();
  std::lock_guard lock(ctx.mutex);
  StreamBuffers& b = ctx.buffers[stream];
  grow(b.scratch, b.scratch_bytes, bytes, stream);
  return static_cast<char*>(b.scratch);
}

void run(const Plan& p, const MatmulShape& s, const Operands& in, void* d) {
  cudaStream_t stream = current_stream();
  if (s.scale_a != kNoScale) {
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, in.scale_a);
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, in.scale_b);
  }
  const auto [workspace, workspace_bytes] = workspace_for(stream, p.workspace_bytes);
  LOCKSTEP_CUBLAS_CHECK(
      matmul(context().handle, p, p.algo, s, in.a, in.b, d, workspace, workspace_bytes, stream));
}

[[noreturn]] void no_algorithm(const MatmulShape& s) {
  fail(detail::concat("cuBLASLt has no algorithm for GEMM m=", s.m, " n=", s.n, " k=", s.k,
                      s.exact ? " in one algorithm for every token count (the exact forward kernels, "
                                "ops/forward_kernels.h)" : ""));
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
  const Operands native{weight, act.data(), weight_scales, act_scale_ptr};
  if (const Plan* p = plan_for(s, native)) return run(*p, s, native, out.data());
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
  const Operands padded{weight, pact, weight_scales, reinterpret_cast<const float*>(pscale)};
  const Plan* p = plan_for(s, padded);
  if (!p) no_algorithm(s);
  if (s.accumulate)  // the padding rows of pout accumulate onto garbage, and are dropped
    LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(pout, out.data(), out.nbytes(), cudaMemcpyDeviceToDevice, stream));
  run(*p, s, padded, pout);
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(out.data(), pout, out.nbytes(), cudaMemcpyDeviceToDevice, stream));
}

void gemm_fp8_cublaslt(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight) {
  const int64_t T = act.rows(), K = act.cols(), M = weight.rows();
  MatmulShape s{CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, cuda_type(out.dtype()),
                M, T, K, K, K, M, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, false, 0};
  run_token_gemm(s, weight.data.data(), weight.scales.data_as<float>(), act.data, &act.scales, out);
}

// Whether the small-T kernel beats cuBLASLt on this call's operands (see gemm_set_fp8_small_t):
// each runs twice kTuneReps times into `out` (which the call itself then overwrites), after a
// warm-up that makes cuBLASLt's plan, with the L2 cache flushed before every timed call; the
// better mean of each counts. The untimed rule while capturing, or when the flush buffer does not
// fit in memory.
bool small_t_faster(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight, bool verbose) {
  const int64_t T = act.rows();
  if (capturing()) return T <= kSmallTUntunedTokens;
  int device = 0, l2_bytes = 0;
  LOCKSTEP_CUDA_CHECK(cudaGetDevice(&device));
  LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  const size_t flush_bytes = 2 * size_t(l2_bytes);
  void* flush = nullptr;
  if (cudaMalloc(&flush, flush_bytes) != cudaSuccess) {
    (void)cudaGetLastError();  // out of memory is not sticky: clear it
    return T <= kSmallTUntunedTokens;
  }
  cudaStream_t stream = current_stream();
  const std::function<void()> flush_l2 = [&] { LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(flush, 0, flush_bytes, stream)); };
  float small_t = INFINITY, cublaslt = INFINITY;
  for (int round = 0; round < 2; ++round) {
    small_t = std::min(small_t, per_call_ms([&] { gemm_fp8_small_t(out, act, weight); return true; }, flush_l2));
    cublaslt = std::min(cublaslt, per_call_ms([&] { gemm_fp8_cublaslt(out, act, weight); return true; }, flush_l2));
  }
  LOCKSTEP_CUDA_CHECK(cudaFree(flush));
  const bool faster = !(cublaslt < kTuneMargin * small_t);
  if (verbose)
    std::fprintf(stderr, "gemm fp8 small-T choice m=%ld n=%ld k=%ld: small-T %.4f ms, cuBLASLt %.4f ms: %s\n",
                 long(weight.rows()), long(T), long(act.cols()), small_t, cublaslt, faster ? "small-T" : "cuBLASLt");
  return faster;
}

// What gemm_fp8 runs for `shape` under the current settings; nullopt: not decided yet (its first
// call times both).
std::optional<bool> small_t_decided(const Context& ctx, const SmallTShape& shape) {
  if (shape.tokens < 1 || shape.tokens > kFp8SmallTMaxTokens) return false;
  if (ctx.small_t != kFp8SmallTAuto) return shape.tokens <= ctx.small_t;
  if (ctx.choice != kAutotune) return shape.tokens <= kSmallTUntunedTokens;
  const auto it = ctx.small_t_picks.find(shape);
  if (it == ctx.small_t_picks.end()) return std::nullopt;
  return it->second;
}

// The small-T kernel's CTAs take 64 weight rows each (ops/cuda/gemm_fp8_small_t.h); a weight of
// other rows runs on cuBLASLt. (K is stored padded to whole blocks, which the kernel takes as it is.)
bool small_t_takes(int64_t rows) { return rows % kFp8SmallTRows == 0; }

bool small_t_runs(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight) {
  if (!small_t_takes(weight.rows())) return false;
  Context& ctx = context();
  const SmallTShape shape{act.rows(), weight.rows(), act.cols(), out.dtype()};
  bool verbose = false;
  {
    std::lock_guard lock(ctx.mutex);
    if (const std::optional<bool> decided = small_t_decided(ctx, shape)) return *decided;
    verbose = ctx.verbose;
  }
  // Unlocked: timing runs cuBLASLt, which takes the lock. Another thread may decide the same shape
  // meanwhile; the first decision stays.
  const bool faster = small_t_faster(out, act, weight, verbose);
  std::lock_guard lock(ctx.mutex);
  return ctx.small_t_picks.emplace(shape, faster).first->second;
}

}  // namespace

void gemm_force_token_padding(bool on) { context().force_padding = on; }

// Tests and benchmarks (ops/gemm_backends.h): how plans made from now on pick
// their algorithm. kAutotune (-1, the default): the fastest candidate; i >= 0: candidate i, 0
// being the heuristic's first choice (the default under LOCKSTEP_GEMM_AUTOTUNE=0); past the last
// candidate a shape has no algorithm. The choice is part of a plan's key, so plans of different
// choices coexist. Returns the previous choice.
int gemm_set_algo_choice(int choice) {
  Context& ctx = context();
  std::lock_guard lock(ctx.mutex);
  return std::exchange(ctx.choice, choice);
}

int gemm_set_fp8_small_t(int tokens) {
  LOCKSTEP_CHECK(tokens == kFp8SmallTAuto || (tokens >= 0 && tokens <= kFp8SmallTMaxTokens),
                 "gemm_set_fp8_small_t: expected kFp8SmallTAuto (", kFp8SmallTAuto, ") or 0 .. ",
                 kFp8SmallTMaxTokens, " tokens, got ", tokens);
  Context& ctx = context();
  std::lock_guard lock(ctx.mutex);
  return std::exchange(ctx.small_t, tokens);
}

bool gemm_fp8_uses_small_t(int64_t tokens, int64_t rows, int64_t k, DType out) {
  if (!small_t_takes(rows)) return false;
  Context& ctx = context();
  std::lock_guard lock(ctx.mutex);
  return small_t_decided(ctx, {tokens, rows, k, out}).value_or(tokens <= kSmallTUntunedTokens);
}

void gemm_fprop_bf16(Tensor& y, const Tensor& x, const Tensor& w) {
  check_aligned16(x, "gemm_fprop: x");
  check_aligned16(w, "gemm_fprop: w");
  const int64_t T = x.dim(0), K = x.dim(1), N = w.dim(0);
  MatmulShape s{CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_16BF, cuda_type(y.dtype()),
                N, T, K, K, K, N, kNoScale, kNoScale, false, 0};
  // The exact forward kernels (ops/forward_kernels.h): a row's sum over K in one order, whatever T.
  s.exact = exact_forward();
  run_token_gemm(s, w.data(), nullptr, x, nullptr, y);
}

void gemm_dgrad_bf16(Tensor& dx, const Tensor& dy, const Tensor& w, bool accumulate) {
  check_aligned16(dy, "gemm_dgrad: dy");
  check_aligned16(w, "gemm_dgrad: w");
  const int64_t T = dy.dim(0), N = dy.dim(1), K = w.dim(1);
  MatmulShape s{CUBLAS_OP_N, CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_16BF, cuda_type(dx.dtype()),
                K, T, N, K, N, K, kNoScale, kNoScale, accumulate, 0};
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
  const Operands in{x.data(), dy.data(), nullptr, nullptr};
  const Plan* p = plan_for(s, in);
  if (!p) no_algorithm(s);
  run(*p, s, in, dw.data());
}

void gemm_fp8(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight) {
  check_aligned16(act.data, "fp8 gemm: activation");
  check_aligned16(weight.data, "fp8 gemm: weight");
  if (small_t_runs(out, act, weight)) return gemm_fp8_small_t(out, act, weight);
  gemm_fp8_cublaslt(out, act, weight);
}

void gemm_fp8_fprop(Tensor& y, const Fp8Rows& x, const Fp8Blocks& w) {
  if (!exact_forward()) return gemm_fp8(y, x, w);
  check_aligned16(x.data, "fp8 gemm: activation");
  check_aligned16(w.data, "fp8 gemm: weight");
  gemm_fp8_batch_invariant(y, x, w);
}

void gemm_wgrad_fp8(Tensor& dw, const Fp8Rows& dy_t, const Fp8Rows& x_t, bool accumulate) {
  check_aligned16(dy_t.data, "gemm_wgrad: dy_t");
  check_aligned16(x_t.data, "gemm_wgrad: x_t");
  const int64_t N = dy_t.rows(), K = x_t.rows(), Tp = x_t.cols();
  MatmulShape s{CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_32F,
                K, N, Tp, Tp, Tp, K, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
                CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, accumulate,
                alignment_of({dy_t.data.data(), x_t.data.data(), dw.data()})};
  const Operands in{x_t.data.data(), dy_t.data.data(), x_t.scales.data_as<float>(), dy_t.scales.data_as<float>()};
  const Plan* p = plan_for(s, in);
  if (!p) no_algorithm(s);
  run(*p, s, in, dw.data());
}

}  // namespace lockstep::cuda
