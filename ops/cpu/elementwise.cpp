// ops/cpu/elementwise.cpp — CPU reference for ops/elementwise.h. Flat tensors are processed in
// chunks of a fixed size, so sum_squares combines the same partial sums whatever the thread count.
#include <algorithm>
#include <vector>

#include "ops/cpu/act.h"
#include "ops/elementwise_backends.h"

namespace lockstep::cpu {

namespace {

constexpr int64_t kChunk = 4096;      // elements per task in the flat ops
constexpr int64_t kColumnBlock = 64;  // bias_backward: columns per task

int64_t count_chunks(int64_t n) { return (n + kChunk - 1) / kChunk; }

// Σ p[i]² in double: 4 interleaved lanes (vectorizable), then a fixed tree.
double chunk_sum_squares(const float* p, int64_t n) {
  double lane[4] = {};
  const int64_t whole = n / 4 * 4;
  for (int64_t i = 0; i < whole; i += 4)
    for (int l = 0; l < 4; ++l) lane[l] += double(p[i + l]) * double(p[i + l]);
  for (int l = 0; l < int(n - whole); ++l) lane[l] += double(p[whole + l]) * double(p[whole + l]);
  return (lane[0] + lane[2]) + (lane[1] + lane[3]);
}

}  // namespace

void add_into(Tensor& y, const Tensor& x) {
  const int64_t n = y.numel(), chunks = count_chunks(n);
#pragma omp parallel
  {
    std::vector<float> yb(kChunk), xb(kChunk);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t begin = c * kChunk, len = std::min(kChunk, n - begin);
      read_f32(y, begin, len, yb.data());
      read_f32(x, begin, len, xb.data());
      for (int64_t i = 0; i < len; ++i) yb[i] += xb[i];
      write_f32(y, begin, len, yb.data());
    }
  }
}

void add_bias(Tensor& y, const Tensor& b) {
  const int64_t T = y.dim(0), N = y.dim(1);
  const float* bp = b.data_as<float>();
#pragma omp parallel
  {
    std::vector<float> row(N);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      read_f32(y, t * N, N, row.data());
      for (int64_t i = 0; i < N; ++i) row[i] += bp[i];
      write_f32(y, t * N, N, row.data());
    }
  }
}

// Parallel over columns; each column adds its rows in increasing t.
void bias_backward(Tensor& db, const Tensor& dy) {
  const int64_t T = dy.dim(0), N = dy.dim(1);
  const int64_t blocks = (N + kColumnBlock - 1) / kColumnBlock;
  float* dbp = db.data_as<float>();
#pragma omp parallel
  {
    std::vector<float> row(kColumnBlock), acc(kColumnBlock);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = b * kColumnBlock, n = std::min(kColumnBlock, N - c0);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t t = 0; t < T; ++t) {
        read_f32(dy, t * N + c0, n, row.data());
        for (int64_t i = 0; i < n; ++i) acc[i] += row[i];
      }
      for (int64_t i = 0; i < n; ++i) dbp[c0 + i] += acc[i];
    }
  }
}

void convert(Tensor& dst, const Tensor& src) {
  const int64_t n = src.numel(), chunks = count_chunks(n);
#pragma omp parallel
  {
    std::vector<float> buf(kChunk);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t begin = c * kChunk, len = std::min(kChunk, n - begin);
      read_f32(src, begin, len, buf.data());
      write_f32(dst, begin, len, buf.data());
    }
  }
}

double sum_squares(const Tensor& x) {
  const int64_t n = x.numel(), chunks = count_chunks(n);
  const float* p = x.data_as<float>();
  std::vector<double> partial(chunks);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c)
    partial[c] = chunk_sum_squares(p + c * kChunk, std::min(kChunk, n - c * kChunk));
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace lockstep::cpu
