// ops/cuda/sample.cu — ops/sample.h on CUDA, in three launches.
//
// Split path: greedy draws and untruncated ones (top_k 0 or ≥ V, top_p 1), what rollouts use. A
// CTA per (draw, kVocabChunk chunk) of the row, grid (D, chunks):
//   chunk_max_kernel   the chunk's max z (softmax_fold.cuh's chunk_max_z), NaN flag, argmax key;
//   chunk_sums_kernel  the chunk's fold sums at the fold's running max through the chunk (the
//                      prefix max of the chunk maxes) and its weight Σ W at the row's max z;
// then sample_kernel (a CTA per draw) replays the fold over the chunks in increasing order — the
// same operations on the same values as one CTA folding the row, so the logprob keeps the bits of
// logits_logprob — and finds the token in the chunk where u·total falls (step 4 below).
//
// Truncated draws (top-k / top-p): the split kernels return at once, and in sample_kernel the
// draw's CTA walks its logits row (L2-resident at small batches) in passes, each with coalesced
// 16-byte loads:
//   1. the logits_logprob fold of the row (ops/cuda/softmax_fold.cuh: its max and sum give the
//      logprob) and NaN detection;
//   2. top-k (0 < top_k < V): radix select of the top_k-th largest sort key;
//   3. top-p (top_p < 1): radix search of the shortest prefix, in sort-key order, of the top-k set
//      whose weight reaches top_p of the set's;
//   4. the kept weight of each kVocabChunk chunk, then, in the chunk where u·total falls, a CTA
//      scan in increasing id order to the token.
//
// Sort keys: key(v) = (order-preserving bits of l_v, −0 read as +0) << kSampleIdBits |
// (kMaxSampleVocab − 1 − v): distinct, and key(a) > key(b) exactly when a precedes b in
// ops/sample.h's `order`. A kept set, a prefix of `order`, is then {v : key(v) ≥ θ} for one θ.
// Radix passes take 11-bit digits from the top of the 51-bit keys and stop as soon as the bin
// holding the boundary is kept whole (top-k: it holds exactly the keys still needed; top-p: it
// holds one key of positive weight), usually after two or three digits.
//
// Weights: W(v) = round(2^44 · exp(z_v − max z)) as u64 and every sum of them is exact, hence
// independent of the summation order (a chunk's total from pass 4 equals its scan's) and
// deterministic; u64 holds V ≤ 2^19 weights ≤ 2^44. Histograms count (warp-aggregated) and add
// weights in shared memory with integer atomics: deterministic too. z = l·(1/τ) as in the CUDA
// lm_head fold. Both paths give the same chunk weights and the same fold, hence the same token
// and logprob: the split path only spreads the work.
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "core/philox.h"
#include "ops/cuda/softmax_fold.cuh"
#include "ops/sample.h"
#include "ops/sample_backends.h"

namespace lockstep::cuda {

namespace {

using u64 = unsigned long long;  // the type of CUDA's 64-bit atomics and shuffles

constexpr int kKeyBits = 32 + kSampleIdBits;
constexpr int kDigitBits = 11;
constexpr int kBins = 1 << kDigitBits;
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int kMaxChunks = int(kMaxSampleVocab / kVocabChunk);
constexpr int kScanItems = int(kVocabChunk) / kThreads;  // consecutive ids per thread in the scan
constexpr float kWeightScale = 0x1p44f;
static_assert(kBins % kThreads == 0 && kMaxSampleVocab % kVocabChunk == 0);
static_assert(kSampleIdBits + 44 <= 64, "a sum of V weights must fit u64");

// The split path's results for one (draw, chunk): max_z, nan and best from chunk_max_kernel, the
// rest from chunk_sums_kernel (not written when the row has a NaN or no finite max: then unread).
struct ChunkStat {
  float max_z;         // chunk_max_z
  unsigned nan;        // the chunk holds a NaN
  float sum, shifted;  // chunk_sums at the running max of the fold through this chunk
  u64 best;            // the largest sort key (greedy draws)
  u64 weight;          // Σ W at the row's max z (sampled draws)
};
static_assert(sizeof(ChunkStat) == 32 && sizeof(ChunkStat) % 8 == 0);

struct SampleSmem {
  Smem fold;
  ChunkStat chunk[kMaxChunks];
  float fold_max, fold_sum, fold_shifted;  // the replayed RowFold (no initializers in __shared__)
  u64 best;
  int nan;
  unsigned count[kBins];
  u64 weight[kBins];
  u64 partial[kWarps];
  u64 chunk_weight[kMaxChunks];
  u64 found_above;
  int found_bin;
  int token;
};

__device__ __forceinline__ u64 sort_key(float logit, int v) {
  const uint32_t bits = __float_as_uint(__fadd_rn(logit, 0.0f));  // −0 + 0 = +0
  const uint32_t ordered = bits & 0x80000000u ? ~bits : bits | 0x80000000u;
  return u64(ordered) << kSampleIdBits | u64(kMaxSampleVocab - 1 - v);
}

__device__ __forceinline__ int id_of(u64 key) {
  return int(kMaxSampleVocab - 1 - int64_t(key & u64(kMaxSampleVocab - 1)));
}

// W of a logit. Explicit roundings (no fma contraction) so that every pass gets the same bits.
__device__ __forceinline__ u64 weight_of(float logit, float inv_t, float max_z) {
  const float w = expf(__fsub_rn(__fmul_rn(logit, inv_t), max_z));
  return __float2ull_rn(w * kWeightScale);
}

// f(logit, v) for each element v < V of a chunk [v0, v0 + kVocabChunk) held as load_chunk leaves
// it (its −inf padding past V is skipped).
template <class F>
__device__ __forceinline__ void for_each_element(const float (&x)[kLoads][kVec], int64_t v0,
                                                 int64_t V, F&& f) {
#pragma unroll
  for (int i = 0; i < kLoads; ++i)
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const int64_t v = v0 + (i * kThreads + int(threadIdx.x)) * kVec + j;
      if (v < V) f(x[i][j], int(v));
    }
}

// For each element v < V of a chunk, b = bin(logit, v), and count[b] += 1 for b ≥ 0, by
// warp-aggregated atomics: the lanes of a warp that share a bin add once, together, so the few
// bins that hold the bulk of a row do not serialize. Every lane of the warp takes part.
template <class F>
__device__ __forceinline__ void count_bins(const float (&x)[kLoads][kVec], int64_t v0, int64_t V,
                                           unsigned* count, F&& bin) {
#pragma unroll
  for (int i = 0; i < kLoads; ++i)
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const int64_t v = v0 + (i * kThreads + int(threadIdx.x)) * kVec + j;
      const int b = v < V ? bin(x[i][j], int(v)) : -1;
      const unsigned peers = __match_any_sync(0xffffffffu, b);
      if (b >= 0 && int(threadIdx.x) % 32 == __ffs(int(peers)) - 1)
        atomicAdd(&count[b], unsigned(__popc(int(peers))));
    }
}

// The CTA's sum / max of v, in every thread.
__device__ u64 block_sum_u64(u64 v, u64* partial) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  u64 r = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) r += partial[w];
  __syncthreads();
  return r;
}

__device__ u64 block_max_u64(u64 v, u64* partial) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  u64 r = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) r = max(r, partial[w]);
  __syncthreads();
  return r;
}

// Σ v over the threads before this one (in threadIdx order).
__device__ u64 block_exclusive_sum(u64 v, u64* partial) {
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  u64 inclusive = v;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const u64 up = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += up;
  }
  if (lane == 31) partial[warp] = inclusive;
  __syncthreads();
  u64 before = 0;
  for (int w = 0; w < warp; ++w) before += partial[w];
  __syncthreads();
  return before + inclusive - v;
}

// Of value[0, bins) read from the top (bin bins − 1 first), the bin b where the running total
// reaches `needed` (total above b < needed ≤ total through b) into s.found_bin, and the total
// above it into s.found_above. Needs 1 ≤ needed ≤ Σ value. The threads hold consecutive ranks
// from the top; the one whose range holds the crossing (exactly one) walks its bins.
template <class T>
__device__ void find_from_top(const T* value, int bins, u64 needed, SampleSmem& s) {
  u64 own = 0;
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) {
    const int rank = int(threadIdx.x) * kBinsPerThread + j;
    if (rank < bins) own += value[bins - 1 - rank];
  }
  u64 above = block_exclusive_sum(own, s.partial);
  if (above < needed && needed <= above + own) {
    for (int j = 0; j < kBinsPerThread; ++j) {
      const int b = bins - 1 - (int(threadIdx.x) * kBinsPerThread + j);
      if (b < 0) break;
      if (above + value[b] >= needed) {
        s.found_bin = b;
        s.found_above = above;
        break;
      }
      above += value[b];
    }
  }
  __syncthreads();
}

// The threshold θ of the top_k set (0 < top_k < V): its keys are those ≥ θ.
__device__ u64 top_k_threshold(const float* row, int64_t V, u64 top_k, SampleSmem& s) {
  u64 prefix = 0, needed = top_k;  // the bin `prefix` (digits so far) holds the needed-th key
  for (int shift = kKeyBits;;) {
    const int high = shift, bits = min(kDigitBits, shift), bins = 1 << bits;
    shift -= bits;  // this digit: key bits [shift, high)
    for (int b = int(threadIdx.x); b < bins; b += kThreads) s.count[b] = 0;
    __syncthreads();
    for_each_chunk(row, V, [&](const float (&x)[kLoads][kVec], int64_t v0) {
      count_bins(x, v0, V, s.count, [&](float logit, int v) {
        const u64 key = sort_key(logit, v);
        return (key >> high) == prefix ? int((key >> shift) & u64(bins - 1)) : -1;
      });
    });
    __syncthreads();
    find_from_top(s.count, bins, needed, s);
    const int b = s.found_bin;
    needed -= s.found_above;
    const u64 in_bin = s.count[b];
    __syncthreads();  // all have read the bins and the result before they are written again
    prefix = prefix << bits | u64(b);
    if (in_bin == needed || shift == 0) return prefix << shift;
  }
}

// The threshold θ of the shortest prefix, in key order, of the keys ≥ kept_from whose weight
// reaches top_p of theirs (ceil, as integers: a sum ≥ the real target). Keys of weight 0 are left
// out: they cannot reach a target ≥ 1 and are never drawn, wherever θ falls among them.
__device__ u64 top_p_threshold(const float* row, int64_t V, float top_p, u64 kept_from,
                               float inv_t, float max_z, SampleSmem& s) {
  u64 prefix = 0, needed = 0;  // the bin `prefix` holds the crossing, `needed` in from its top
  for (int shift = kKeyBits;;) {
    const bool first = shift == kKeyBits;
    const int high = shift, bits = min(kDigitBits, shift), bins = 1 << bits;
    shift -= bits;
    for (int b = int(threadIdx.x); b < bins; b += kThreads) {
      s.count[b] = 0;
      s.weight[b] = 0;
    }
    __syncthreads();
    u64 own = 0;
    for_each_chunk(row, V, [&](const float (&x)[kLoads][kVec], int64_t v0) {
      count_bins(x, v0, V, s.count, [&](float logit, int v) {
        const u64 key = sort_key(logit, v);
        if (key < kept_from || (key >> high) != prefix) return -1;
        const u64 w = weight_of(logit, inv_t, max_z);
        if (w == 0) return -1;
        const int b = int((key >> shift) & u64(bins - 1));
        atomicAdd(&s.weight[b], w);  // per lane: a warp's shares of a bin differ
        own += w;
        return b;
      });
    });
    __syncthreads();
    if (first) {
      const u64 total = block_sum_u64(own, s.partial);  // ≥ 2^44: the largest logit weighs 1
      needed = min(max(__double2ull_ru(double(top_p) * double(total)), 1ull), total);
    }
    find_from_top(s.weight, bins, needed, s);
    const int b = s.found_bin;
    needed -= s.found_above;
    const unsigned in_bin = s.count[b];
    __syncthreads();
    prefix = prefix << bits | u64(b);
    if (in_bin == 1 || shift == 0) return prefix << shift;
  }
}

// The kept weight of each chunk into s.chunk_weight: the weights of the keys ≥ kept_from.
__device__ void chunk_weights(const float* row, int64_t V, u64 kept_from, float inv_t, float max_z,
                              SampleSmem& s) {
  for_each_chunk(row, V, [&](const float (&x)[kLoads][kVec], int64_t v0) {
    u64 own = 0;
    for_each_element(x, v0, V, [&](float logit, int v) {
      if (sort_key(logit, v) >= kept_from) own += weight_of(logit, inv_t, max_z);
    });
    const u64 sum = block_sum_u64(own, s.partial);
    if (threadIdx.x == 0) s.chunk_weight[v0 / kVocabChunk] = sum;
  });
}

// The first id, in increasing order, of the keys ≥ kept_from whose cumulative weight reaches
// ceil(u · their total weight), s.chunk_weight holding each chunk's kept weight.
__device__ int draw_token(const float* row, int64_t V, u64 kept_from, float inv_t, float max_z,
                          double u, SampleSmem& s) {
  __syncthreads();  // s.chunk_weight is complete
  const int chunks = int((V + kVocabChunk - 1) / kVocabChunk);
  u64 total = 0;
  for (int c = 0; c < chunks; ++c) total += s.chunk_weight[c];
  u64 target = min(max(__double2ull_ru(u * double(total)), 1ull), total);
  int chunk = 0;
  while (chunk + 1 < chunks && s.chunk_weight[chunk] < target) target -= s.chunk_weight[chunk++];

  // Thread t scans ids [first, first + kScanItems) of the chunk; 1 ≤ target ≤ the chunk's weight.
  const int64_t first = int64_t(chunk) * kVocabChunk + int64_t(threadIdx.x) * kScanItems;
  u64 w[kScanItems], own = 0;
#pragma unroll
  for (int j = 0; j < kScanItems; ++j) {
    const int64_t v = first + j;
    const float logit = v < V ? row[v] : 0.0f;
    w[j] = v < V && sort_key(logit, int(v)) >= kept_from ? weight_of(logit, inv_t, max_z) : 0;
    own += w[j];
  }
  u64 before = block_exclusive_sum(own, s.partial);
  if (before < target && target <= before + own) {
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {
      before += w[j];
      if (before >= target) {
        s.token = int(first + j);
        break;
      }
    }
  }
  __syncthreads();
  return s.token;
}

__device__ __forceinline__ bool spec_ok(const SampleSpec& spec, int64_t rows) {
  return spec.row >= 0 && spec.row < rows && isfinite(spec.temperature) &&
         spec.temperature >= 0.0f && spec.top_p > 0.0f && spec.top_p <= 1.0f && spec.top_k >= 0;
}

// Whether a (valid) draw takes the split path: greedy, or sampled without truncation.
__device__ __forceinline__ bool split_path(const SampleSpec& spec, int64_t V) {
  return spec.temperature == 0.0f || ((spec.top_k == 0 || spec.top_k >= V) && spec.top_p >= 1.0f);
}

__device__ __forceinline__ float inv_temperature(const SampleSpec& spec) {
  return spec.temperature == 0.0f ? 1.0f : 1.0f / spec.temperature;
}

// Chunk blockIdx.y of draw blockIdx.x into x (as for_each_chunk holds it); its first id is v0.
__device__ __forceinline__ void load_split_chunk(float (&x)[kLoads][kVec], const float* row,
                                                 int64_t V, int64_t v0) {
  load_chunk(x, row + v0, int(V - v0 < kVocabChunk ? V - v0 : kVocabChunk));
}

// Split path, first pass: a CTA per (draw, chunk) writes the chunk's max z, NaN flag and, for a
// greedy draw, largest sort key.
__global__ void __launch_bounds__(kThreads)
    chunk_max_kernel(const float* logits, int64_t rows, int64_t V, const SampleSpec* specs,
                     ChunkStat* stats) {
  __shared__ Smem smem;
  __shared__ u64 partial[kWarps];
  const int64_t d = blockIdx.x, v0 = int64_t(blockIdx.y) * kVocabChunk;
  const SampleSpec spec = specs[d];
  if (!spec_ok(spec, rows) || !split_path(spec, V)) return;  // sample_kernel draws it
  const bool greedy = spec.temperature == 0.0f;
  float x[kLoads][kVec];
  load_split_chunk(x, logits + spec.row * V, V, v0);
  bool nan = false;
  u64 best = 0;
  for_each_element(x, v0, V, [&](float logit, int v) {
    nan |= isnan(logit);
    if (greedy) best = max(best, sort_key(logit, v));
  });
  const float max_z = chunk_max_z(x, inv_temperature(spec), smem);
  nan = __syncthreads_or(nan);
  if (greedy) best = block_max_u64(best, partial);
  if (threadIdx.x != 0) return;
  ChunkStat& st = stats[d * gridDim.y + blockIdx.y];
  st.max_z = max_z;
  st.nan = nan;
  st.best = best;
}

// Split path, second pass: a CTA per (draw, chunk) reads the chunk maxes of its row and writes the
// chunk's fold sums at the running max through it (as fold_chunk gets them) and, for a sampled
// draw, its weight at the row's max z. Rows with a NaN or no finite max are left to sample_kernel.
__global__ void __launch_bounds__(kThreads)
    chunk_sums_kernel(const float* logits, int64_t rows, int64_t V, const SampleSpec* specs,
                      ChunkStat* stats) {
  __shared__ Smem smem;
  __shared__ u64 partial[kWarps];
  __shared__ float max_z[kMaxChunks];
  const int64_t d = blockIdx.x, v0 = int64_t(blockIdx.y) * kVocabChunk;
  const int chunks = int(gridDim.y), chunk = int(blockIdx.y);
  const SampleSpec spec = specs[d];
  if (!spec_ok(spec, rows) || !split_path(spec, V)) return;
  ChunkStat* row_stats = stats + d * chunks;
  bool nan = false;
  for (int c = int(threadIdx.x); c < chunks; c += kThreads) {
    max_z[c] = row_stats[c].max_z;
    nan |= row_stats[c].nan != 0;
  }
  if (__syncthreads_or(nan)) return;
  float running = -INFINITY, row_max = -INFINITY;  // as RowFold::max through `chunk` and the row
  for (int c = 0; c < chunks; ++c) {
    if (max_z[c] > row_max) row_max = max_z[c];
    if (c == chunk) running = row_max;
  }
  if (!isfinite(row_max)) return;
  const bool greedy = spec.temperature == 0.0f;
  const float inv_t = inv_temperature(spec);
  float x[kLoads][kVec];
  load_split_chunk(x, logits + spec.row * V, V, v0);
  const float2 r = chunk_sums(x, inv_t, running, smem);
  u64 own = 0;
  if (!greedy) for_each_element(x, v0, V, [&](float logit, int) { own += weight_of(logit, inv_t, row_max); });
  const u64 weight = greedy ? 0 : block_sum_u64(own, partial);
  if (threadIdx.x != 0) return;
  ChunkStat& st = row_stats[chunk];
  st.sum = r.x;
  st.shifted = r.y;
  st.weight = weight;
}

// CTA d: draw d, from the split kernels' chunk results or, for a truncated draw, from its row.
// Every branch below is uniform across the CTA (it depends on the spec and on block-wide
// reductions only).
__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* logits, int64_t rows, int64_t V, const SampleSpec* specs,
                  const ChunkStat* stats, int chunks, int32_t* tokens, float* logprobs) {
  __shared__ SampleSmem s;
  const int64_t d = blockIdx.x;
  const SampleSpec spec = specs[d];
  auto refuse = [&] {
    if (threadIdx.x == 0) {
      tokens[d] = -1;
      logprobs[d] = NAN;
    }
  };
  if (!spec_ok(spec, rows)) return refuse();
  if (threadIdx.x == 0) {  // defined even if a search below went wrong: token −1, no stray index
    s.token = -1;
    s.found_bin = 0;
    s.found_above = 0;
  }

  const float* row = logits + spec.row * V;
  const bool greedy = spec.temperature == 0.0f, split = split_path(spec, V);
  const float inv_t = inv_temperature(spec);
  RowFold f;
  bool nan = false;
  if (split) {
    for (int c = int(threadIdx.x); c < chunks; c += kThreads) s.chunk[c] = stats[d * chunks + c];
    __syncthreads();
    if (threadIdx.x == 0) {  // fold_chunk's steps over the chunks in order: the same bits
      RowFold g;
      int any_nan = 0;
      u64 best = 0;
      for (int c = 0; c < chunks; ++c) {
        const ChunkStat& st = s.chunk[c];
        any_nan |= int(st.nan != 0);
        best = max(best, st.best);
        raise_max(g, st.max_z);
        g.sum += st.sum;
        g.shifted += st.shifted;
        s.chunk_weight[c] = st.weight;
      }
      s.fold_max = g.max;
      s.fold_sum = g.sum;
      s.fold_shifted = g.shifted;
      s.nan = any_nan;
      s.best = best;
    }
    __syncthreads();
    f.max = s.fold_max;
    f.sum = s.fold_sum;
    f.shifted = s.fold_shifted;
    nan = s.nan != 0;
  } else {
    for_each_chunk(row, V, [&](const float (&x)[kLoads][kVec], int64_t v0) {
      fold_chunk(f, x, inv_t, s.fold);
      for_each_element(x, v0, V, [&](float logit, int) { nan |= isnan(logit); });
    });
  }
  if (__syncthreads_or(nan) || !isfinite(f.max)) return refuse();

  int token;
  if (greedy) {
    token = id_of(s.best);
  } else {
    u64 kept_from = 0;
    if (!split) {
      if (spec.top_k > 0 && spec.top_k < V) kept_from = top_k_threshold(row, V, u64(spec.top_k), s);
      if (spec.top_p < 1.0f)
        kept_from = max(kept_from, top_p_threshold(row, V, spec.top_p, kept_from, inv_t, f.max, s));
      chunk_weights(row, V, kept_from, inv_t, f.max, s);
    }
    const double u = philox_uniform53(philox_at(spec.seed, spec.stream, spec.position));
    token = draw_token(row, V, kept_from, inv_t, f.max, u, s);
  }
  if (threadIdx.x != 0) return;
  tokens[d] = token;
  logprobs[d] = token >= 0 ? fold_logprob(f, row[token], inv_t) : NAN;
}

}  // namespace

void sample_tokens(Tensor& tokens, Tensor& logprobs, const Tensor& logits, const Tensor& specs) {
  const int64_t draws = specs.dim(0);
  LOCKSTEP_CHECK(draws <= INT32_MAX, "sample_tokens: ", draws,
                 " draws are more than one launch takes");
  const int64_t rows = logits.dim(0), V = logits.dim(1);
  const int chunks = int((V + kVocabChunk - 1) / kVocabChunk);
  const float* l = logits.data_as<float>();
  const auto* spec = static_cast<const SampleSpec*>(specs.data());
  Tensor scratch = Tensor::empty({draws, chunks, int64_t(sizeof(ChunkStat) / 8)}, DType::i64,
                                 Device::cuda);
  auto* stats = static_cast<ChunkStat*>(scratch.data());
  const dim3 split_grid{unsigned(draws), unsigned(chunks)};
  chunk_max_kernel<<<split_grid, kThreads, 0, current_stream()>>>(l, rows, V, spec, stats);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  chunk_sums_kernel<<<split_grid, kThreads, 0, current_stream()>>>(l, rows, V, spec, stats);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  sample_kernel<<<unsigned(draws), kThreads, 0, current_stream()>>>(
      l, rows, V, spec, stats, chunks, tokens.data_as<int32_t>(), logprobs.data_as<float>());
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda
