// ops/cpu/gemm.cpp — CPU GEMMs in the TN form out[i][j] (+)= Σ_k a[i][k]·b[j][k].
//
// Every output element is one dot product, computed by the same floating-point operations
// wherever it sits: element k of the product goes into lane k % 8 of an fp32 accumulator
// (fma, increasing k; K is zero-padded to a multiple of 8), and the 8 lanes are summed by the fixed
// tree ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). fp8: one such dot per 128-wide K block, then
// acc += partial·(sa·sb) in increasing block order. Tiling, tile edges, M, N and the thread count
// only decide which elements are computed side by side, never how, so a row's result does not
// depend on the rest of the batch: the training forward and token-by-token generation agree bit
// for bit.
//
// Speed: a kMr × kNr micro-tile keeps its 12 lane accumulators in registers (AVX2 intrinsics: an
// explicit vfmadd per lane vector, as the build forbids implicit contraction, and a vectorized form
// of the lane tree). Operands are widened, and transposed where asked (8×8 in registers), into fp32
// panels of kMr or kNr rows interleaved by 8 along K, so the kernel reads two sequential streams;
// with few rows of a (decoding) b is read in place and widened in registers instead. kMc × kNc
// macro tiles are the parallel tasks; they walk K in kKc chunks so that their panels stay in L2,
// parking the accumulators in a per-thread buffer between chunks.
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "core/error.h"
#include "ops/gemm_backends.h"

namespace lockstep::cpu {

namespace {

constexpr int kLanes = 8;
constexpr int kMr = 3, kNr = 4;        // 12 accumulators + 3 a + 1 b: the 16 ymm registers
constexpr int64_t kMc = 48, kNc = 64;  // macro tile: a task of the parallel loop
constexpr int64_t kKc = 1024;  // K chunk (multiple of 128): a 64 × 1024 fp32 b block is 256 KiB
constexpr int64_t kParallelPack = 1 << 15;  // smaller operands are packed by the calling thread

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Floats = std::unique_ptr<float[], FreeDeleter>;

Floats alloc_floats(int64_t n) {
  const size_t bytes = size_t(round_up(std::max<int64_t>(n, 1) * 4, 64));
  float* p = static_cast<float*>(std::aligned_alloc(64, bytes));
  LOCKSTEP_CHECK(p != nullptr, "cpu gemm: out of memory allocating ", bytes, " bytes");
  return Floats(p);
}

inline float widen(float v) { return v; }
inline float widen(bf16 v) { return bf16_to_float(v); }
inline float widen(e4m3 v) { return e4m3_to_float(v); }

// An operand in fp32 panels of `width` rows: panel p holds rows [p·width, p·width + r), r = width
// except in the last panel, as [kp/8][r][8] starting at p·width·kp. Zeros pad K to kp.
struct Panels {
  const float* data;
  int64_t kp;
  const float* panel_of(int64_t row) const { return data + row * kp; }  // row % width == 0
};

// Grow-only scratch of the calling thread for the two packed operands: repeated GEMMs reuse it
// instead of page-faulting fresh memory each time.
float* scratch(int operand, int64_t n) {
  thread_local Floats buffer[2];
  thread_local int64_t capacity[2] = {0, 0};
  if (capacity[operand] < n) {
    buffer[operand].reset();
    buffer[operand] = alloc_floats(n);
    capacity[operand] = n;
  }
  return buffer[operand].get();
}

// Eight consecutive elements as fp32.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
// e4m3_to_float of eight codes: the magnitude bits shifted into an fp32's exponent and mantissa
// give 2^-120 times the value (subnormal codes become fp32 subnormals), so one exact multiply
// by 2^120 finishes; 0x7F/0xFF are NaN.
inline __m256 load8(const e4m3* p) {
  const __m256i code = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i magnitude = _mm256_and_si256(code, _mm256_set1_epi32(0x7f));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, _mm256_set1_epi32(0x80)), 24);
  const __m256 value = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(magnitude, 20)),
                                     _mm256_set1_ps(0x1p120f));
  const __m256i nan = _mm256_cmpeq_epi32(magnitude, _mm256_set1_epi32(0x7f));
  const __m256i bits =
      _mm256_blendv_epi8(_mm256_castps_si256(value), _mm256_set1_epi32(0x7fc00000), nan);
  return _mm256_castsi256_ps(_mm256_or_si256(bits, sign));
}

// v[i] lane l <- v[l] lane i.
inline void transpose8x8(__m256 (&v)[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    s[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
    v[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
  }
}

// Packs a [rows, k] operand stored row-major or, transposed, as [k, rows], into kWidth-row panels.
template <int kWidth, bool kTransposed, class T>
Panels pack(int operand, const T* src, int64_t rows, int64_t k) {
  const int64_t kp = round_up(k, kLanes), whole_k = k / kLanes * kLanes;
  float* const dst = scratch(operand, rows * kp);
  // Where elements (row, kb .. kb+8) go: one vector of the row's panel.
  auto dst_of = [&](int64_t row, int64_t kb) {
    const int64_t r0 = row / kWidth * kWidth;
    return dst + r0 * kp + kb * std::min<int64_t>(kWidth, rows - r0) + (row - r0) * kLanes;
  };
  // One element at a time: the zero-padded K tail and the last rows % 8 transposed rows.
  auto pack_scalar = [&](int64_t row, int64_t kb) {
    float* d = dst_of(row, kb);
    for (int64_t kk = kb; kk < kb + kLanes; ++kk)
      d[kk - kb] = kk < k ? widen(kTransposed ? src[kk * rows + row] : src[row * k + kk]) : 0.0f;
  };
  const bool parallel = rows * kp >= kParallelPack;
  if constexpr (!kTransposed) {
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t kb = 0; kb < whole_k; kb += kLanes)
        _mm256_storeu_ps(dst_of(row, kb), load8(src + row * k + kb));
      if (whole_k < k) pack_scalar(row, whole_k);
    }
  } else {
    // 8×8 blocks transposed in registers; a task takes 32 rows (a 64-byte line of bf16 source)
    // through all of K.
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t c0 = 0; c0 < rows; c0 += 32)
      for (int64_t kb = 0; kb < kp; kb += kLanes)
        for (int64_t c = c0; c < std::min(rows, c0 + 32); c += kLanes) {
          if (c + kLanes > rows || kb == whole_k) {
            for (int64_t row = c; row < std::min(rows, c + kLanes); ++row) pack_scalar(row, kb);
            continue;
          }
          __m256 v[8];
          for (int l = 0; l < kLanes; ++l) v[l] = load8(src + (kb + l) * rows + c);
          transpose8x8(v);
          for (int i = 0; i < kLanes; ++i) _mm256_storeu_ps(dst_of(c + i, kb), v[i]);
        }
  }
  return {dst, kp};
}

template <int kWidth>
Panels pack(int operand, const Operand& op, int64_t k) {
  const Tensor& t = op.t;
  const int64_t rows = op.transposed ? t.dim(1) : t.dim(0);
  if (t.dtype() == DType::f32)
    return op.transposed ? pack<kWidth, true>(operand, t.data_as<float>(), rows, k)
                         : pack<kWidth, false>(operand, t.data_as<float>(), rows, k);
  return op.transposed ? pack<kWidth, true>(operand, t.data_as<bf16>(), rows, k)
                       : pack<kWidth, false>(operand, t.data_as<bf16>(), rows, k);
}

// b as packed panels, or read in place and widened in registers (row-major, K a multiple of 8):
// with few rows of a, packing b would cost more than the product itself (decoding).
struct PackedB {
  Panels p;
  template <int NR>
  auto rows_at(int64_t j, int64_t k0) const {  // (c, s) -> elements 8s .. 8s+8 of row j + c
    const float* base = p.panel_of(j) + k0 * NR;
    return [base](int c, int64_t s) { return _mm256_loadu_ps(base + kLanes * (NR * s + c)); };
  }
};

template <class T>
struct InPlaceB {
  const T* src;
  int64_t ld;
  template <int NR>
  auto rows_at(int64_t j, int64_t k0) const {
    const T* base = src + j * ld + k0;
    return [base, ld = ld](int c, int64_t s) { return load8(base + c * ld + kLanes * s); };
  }
};

// acc[i][j] lane l += a[i][k]·b[j][k] for k = 8s + l, s < steps: a points into a panel of MR rows,
// b(j, s) gives elements 8s .. 8s+8 of row j.
template <int MR, int NR, class BRows>
inline void fma_lanes(__m256 (&acc)[MR][NR], const float* a, const BRows& b, int64_t steps) {
  for (int64_t s = 0; s < steps; ++s, a += kLanes * MR) {
    __m256 av[MR];
    for (int i = 0; i < MR; ++i) av[i] = _mm256_loadu_ps(a + kLanes * i);
    for (int j = 0; j < NR; ++j) {
      const __m256 bv = b(j, s);
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_fmadd_ps(av[i], bv, acc[i][j]);
    }
  }
}

// The lane tree of up to 4 accumulators at once: result c = ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))
// of v[c] (each sum has the same two operands as the scalar tree, so the same rounding).
template <int NR>
inline __m128 lane_sums(const __m256 (&v)[NR]) {
  __m128 u[4];
  for (int c = 0; c < 4; ++c)  // [l0+l4, l1+l5, l2+l6, l3+l7]
    u[c] = c < NR ? _mm_add_ps(_mm256_castps256_ps128(v[c]), _mm256_extractf128_ps(v[c], 1))
                  : _mm_setzero_ps();
  // [(l0+l4)+(l2+l6), (l1+l5)+(l3+l7)] of u[0] and u[1], then of u[2] and u[3].
  const __m128 w01 = _mm_add_ps(_mm_shuffle_ps(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                _mm_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m128 w23 = _mm_add_ps(_mm_shuffle_ps(u[2], u[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                _mm_shuffle_ps(u[2], u[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm_add_ps(_mm_shuffle_ps(w01, w23, _MM_SHUFFLE(2, 0, 2, 0)),
                    _mm_shuffle_ps(w01, w23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// out[i][j .. j+N) (+)= v, rounded once to out's dtype (bf16 or f32).
struct Output {
  float* f32;
  bf16* b16;
  int64_t ld;
  bool accumulate;
  Output(Tensor& t, bool acc)
      : f32(t.dtype() == DType::f32 ? t.data_as<float>() : nullptr),
        b16(t.dtype() == DType::f32 ? nullptr : t.data_as<bf16>()),
        ld(t.dim(1)),
        accumulate(acc) {}

  template <int N>
  void store(int64_t i, int64_t j, __m128 v) const {
    float r[4];
    _mm_storeu_ps(r, v);
    if (f32) {
      float* o = f32 + i * ld + j;
      for (int c = 0; c < N; ++c) o[c] = accumulate ? o[c] + r[c] : r[c];
    } else {
      bf16* o = b16 + i * ld + j;
      if (accumulate)
        for (int c = 0; c < N; ++c) r[c] += bf16_to_float(o[c]);
      // float_to_bf16 of the four values at once: round to nearest even, NaN -> 0x7FFF.
      const __m128i x = _mm_castps_si128(_mm_loadu_ps(r));
      const __m128i odd = _mm_and_si128(_mm_srli_epi32(x, 16), _mm_set1_epi32(1));
      const __m128i rounded =
          _mm_srli_epi32(_mm_add_epi32(x, _mm_add_epi32(_mm_set1_epi32(0x7fff), odd)), 16);
      const __m128i nan =
          _mm_cmpgt_epi32(_mm_and_si128(x, _mm_set1_epi32(0x7fffffff)), _mm_set1_epi32(0x7f800000));
      uint16_t bits[8];
      _mm_storeu_si128(
          reinterpret_cast<__m128i*>(bits),
          _mm_packus_epi32(_mm_blendv_epi8(rounded, _mm_set1_epi32(0x7fff), nan), rounded));
      for (int c = 0; c < N; ++c) o[c].bits = bits[c];
    }
  }
};

template <int MR, class Tile>
void dispatch_nr(Tile& tile, int nr, int64_t i, int64_t j, float* slot) {
  switch (nr) {
    case 4:
      tile.template operator()<MR, 4>(i, j, slot);
      break;
    case 3:
      tile.template operator()<MR, 3>(i, j, slot);
      break;
    case 2:
      tile.template operator()<MR, 2>(i, j, slot);
      break;
    default:
      tile.template operator()<MR, 1>(i, j, slot);
      break;
  }
}

// Calls tile.template operator()<MR, NR>(i, j, slot) for every micro-tile of every kc chunk of
// [m, n], macro tiles in parallel; `slot` is the micro-tile's slot_floats floats in a per-thread
// buffer (needed only when K spans several chunks).
template <class Tile>
void for_each_tile(int64_t m, int64_t n, int64_t kc_count, int64_t slot_floats, const Tile& tile) {
  const int64_t tiles_m = (m + kMc - 1) / kMc, tiles_n = (n + kNc - 1) / kNc;
  constexpr int64_t kSlots = (kMc / kMr) * (kNc / kNr);
#pragma omp parallel
  {
    Tile tile_of_thread = tile;  // holds the current kc
    const Floats buffer = alloc_floats(kc_count > 1 ? kSlots * slot_floats : 0);
    // Tiles in column-major order: the two halves of a static schedule split the columns, which
    // balances them even when there are few row blocks of unequal heights (few tokens).
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles_m * tiles_n; ++t) {
      const int64_t i0 = t % tiles_m * kMc, j0 = t / tiles_m * kNc;
      const int64_t i1 = std::min(m, i0 + kMc), j1 = std::min(n, j0 + kNc);
      for (int64_t kc = 0; kc < kc_count; ++kc) {
        tile_of_thread.kc = kc;
        float* slot = buffer.get();
        for (int64_t j = j0; j < j1; j += kNr)  // a b micro-panel stays in L1 across the i loop
          for (int64_t i = i0; i < i1; i += kMr, slot += slot_floats) {
            const int nr = int(std::min<int64_t>(kNr, j1 - j));
            switch (std::min<int64_t>(kMr, i1 - i)) {
              case 3:
                dispatch_nr<3>(tile_of_thread, nr, i, j, slot);
                break;
              case 2:
                dispatch_nr<2>(tile_of_thread, nr, i, j, slot);
                break;
              default:
                dispatch_nr<1>(tile_of_thread, nr, i, j, slot);
                break;
            }
          }
      }
    }
  }
}

// bf16/f32: the lanes of a micro-tile run over all of K, parked in `slot` between kc chunks.
template <class B>
struct LaneTile {
  const Panels& a;
  B b;
  const Output& out;
  int64_t kc_count;
  int64_t kc = 0;  // set by for_each_tile on its per-thread copy

  template <int MR, int NR>
  void operator()(int64_t i, int64_t j, float* slot) const {
    __m256 acc[MR][NR];
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < NR; ++c)
        acc[r][c] = kc == 0 ? _mm256_setzero_ps() : _mm256_load_ps(slot + (r * NR + c) * kLanes);
    const int64_t k0 = kc * kKc, steps = (std::min(a.kp, k0 + kKc) - k0) / kLanes;
    fma_lanes<MR, NR>(acc, a.panel_of(i) + k0 * MR, b.template rows_at<NR>(j, k0), steps);
    if (kc + 1 < kc_count) {
      for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NR; ++c) _mm256_store_ps(slot + (r * NR + c) * kLanes, acc[r][c]);
      return;
    }
    for (int r = 0; r < MR; ++r) out.store<NR>(i + r, j, lane_sums<NR>(acc[r]));
  }
};

// scale(row, kb) of either fp8 scale layout (numerics/quantize.h).
struct Scales {
  const float* s;
  int64_t row_stride, block_stride, row_div;
  float at(int64_t row, int64_t kb) const {
    return s[(row / row_div) * row_stride + kb * block_stride];
  }
};

// An fp8 operand of gemm_fp8, [rows, k] e4m3 with its scales: an Fp8Rows or Fp8Blocks, or a range
// of its rows (whole 128-row blocks of an Fp8Blocks).
struct Fp8Operand {
  const e4m3* data;
  int64_t rows, k;
  Scales scales;
};

Fp8Operand rows_of(const Fp8Rows& q, int64_t begin, int64_t end) {
  return {q.data.data_as<e4m3>() + begin * q.cols(), end - begin, q.cols(),
          {q.scales.data_as<float>() + begin, 1, q.rows(), 1}};
}
Fp8Operand rows_of(const Fp8Blocks& q, int64_t begin, int64_t end) {
  const int64_t ld = q.scales.dim(1);
  return {q.data.data_as<e4m3>() + begin * q.cols(), end - begin, q.cols(),
          {q.scales.data_as<float>() + begin / kQuantGroup * ld, ld, 1, kQuantGroup}};
}
template <class Q>
Fp8Operand all_of(const Q& q) {
  return rows_of(q, 0, q.rows());
}

// fp8: fresh lanes per 128-wide block; the scaled fp32 sums are parked in `slot` between chunks.
template <class B>
struct Fp8Tile {
  const Panels& a;
  B b;
  Scales sa, sb;
  const Output& out;
  int64_t kc_count;
  int64_t kc = 0;

  template <int MR, int NR>
  void operator()(int64_t i, int64_t j, float* slot) const {
    constexpr int64_t kSteps = kQuantGroup / kLanes;
    __m128 acc[MR];
    for (int r = 0; r < MR; ++r) acc[r] = kc == 0 ? _mm_setzero_ps() : _mm_load_ps(slot + 4 * r);
    const int64_t kb0 = kc * (kKc / kQuantGroup),
                  kb1 = std::min(a.kp, (kc + 1) * kKc) / kQuantGroup;
    for (int64_t kb = kb0; kb < kb1; ++kb) {
      __m256 lanes[MR][NR];
      for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NR; ++c) lanes[r][c] = _mm256_setzero_ps();
      const int64_t k0 = kb * kQuantGroup;
      fma_lanes<MR, NR>(lanes, a.panel_of(i) + k0 * MR, b.template rows_at<NR>(j, k0), kSteps);
      float s[4] = {};
      for (int c = 0; c < NR; ++c) s[c] = sb.at(j + c, kb);
      const __m128 sbv = _mm_loadu_ps(s);
      for (int r = 0; r < MR; ++r) {  // acc += partial * (sa * sb)
        const __m128 scale = _mm_mul_ps(_mm_set1_ps(sa.at(i + r, kb)), sbv);
        acc[r] = _mm_add_ps(acc[r], _mm_mul_ps(lane_sums<NR>(lanes[r]), scale));
      }
    }
    if (kc + 1 < kc_count) {
      for (int r = 0; r < MR; ++r) _mm_store_ps(slot + 4 * r, acc[r]);
      return;
    }
    for (int r = 0; r < MR; ++r) out.store<NR>(i + r, j, acc[r]);
  }
};

// Up to this many rows of a, b is read in place rather than packed (where its layout allows):
// measured break-even points (an e4m3 code costs more to widen in registers than a bf16).
constexpr int64_t kInPlaceRows = 64, kInPlaceRowsFp8 = 8;

// out [a.rows, b.rows] (a view of whole rows).
void gemm_fp8(Tensor& out, const Fp8Operand& a, const Fp8Operand& b, bool accumulate) {
  const int64_t m = a.rows, n = b.rows, k = a.k, kc_count = (k + kKc - 1) / kKc;
  const Panels pa = pack<kMr, false>(0, a.data, m, k);
  const Output o{out, accumulate};
  auto run = [&](auto b_rows) {
    for_each_tile(m, n, kc_count, kMr * 4, Fp8Tile<decltype(b_rows)>{pa, b_rows, a.scales, b.scales, o, kc_count});
  };
  if (m <= kInPlaceRowsFp8) return run(InPlaceB<e4m3>{b.data, k});
  run(PackedB{pack<kNr, false>(1, b.data, n, k)});
}

}  // namespace

void gemm_tn(Tensor& out, const Operand& a, const Operand& b, bool accumulate) {
  const int64_t m = out.dim(0), n = out.dim(1), k = a.transposed ? a.t.dim(0) : a.t.dim(1);
  const Panels pa = pack<kMr>(0, a, k);
  const Output o{out, accumulate};
  const int64_t kc_count = (pa.kp + kKc - 1) / kKc;
  auto run = [&](auto b_rows) {
    for_each_tile(m, n, kc_count, kMr * kNr * kLanes,
                  LaneTile<decltype(b_rows)>{pa, b_rows, o, kc_count});
  };
  if (m <= kInPlaceRows && !b.transposed && k % kLanes == 0) {
    if (b.t.dtype() == DType::f32) return run(InPlaceB<float>{b.t.data_as<float>(), k});
    return run(InPlaceB<bf16>{b.t.data_as<bf16>(), k});
  }
  run(PackedB{pack<kNr>(1, b, k)});
}

void gemm_tn_fp8(Tensor& out, const Fp8Rows& a, const Fp8Rows& b, bool accumulate) {
  gemm_fp8(out, all_of(a), all_of(b), accumulate);
}

void gemm_tn_fp8(Tensor& out, const Fp8Rows& a, const Fp8Blocks& b, bool accumulate) {
  gemm_fp8(out, all_of(a), all_of(b), accumulate);
}

void gemm_fp8_grouped(Tensor& out, const Fp8Rows& a, const Fp8Blocks& b, const std::vector<int64_t>& offsets) {
  const int64_t n = out.dim(1);
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    const int64_t begin = offsets[e], end = offsets[e + 1];
    if (begin == end) continue;
    Tensor rows = out.rows(begin, end);
    gemm_fp8(rows, rows_of(a, begin, end), rows_of(b, int64_t(e) * n, int64_t(e + 1) * n), false);
  }
}

void gemm_bf16_grouped(Tensor& out, const Tensor& a, const std::vector<Tensor>& w, const std::vector<int64_t>& offsets,
                       bool dgrad, bool accumulate) {
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    const int64_t begin = offsets[e], end = offsets[e + 1];
    if (begin == end) continue;
    Tensor rows = out.rows(begin, end);
    gemm_tn(rows, {a.rows(begin, end)}, {w[e], dgrad}, accumulate);
  }
}

}  // namespace lockstep::cpu
