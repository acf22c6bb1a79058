// core/philox.h — Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11),
// the counter-based generator behind all sampling in lockstep. It is a pure function of
// (counter, key), so a token's random numbers depend only on (seed, sequence id, position) and are
// the same on the CPU and the GPU, whatever else is in the batch.
#pragma once

#include <cstdint>

#include "core/dtypes.h"

namespace lockstep {

struct Philox4 { uint32_t v[4]; };
struct PhiloxKey { uint32_t k[2]; };

LOCKSTEP_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

LOCKSTEP_HD Philox4 philox4x32_10(Philox4 ctr, PhiloxKey key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kMul0, ctr.v[0], hi0, lo0);
    philox_mulhilo(kMul1, ctr.v[2], hi1, lo1);
    ctr = Philox4{{hi1 ^ ctr.v[1] ^ key.k[0], lo1, hi0 ^ ctr.v[3] ^ key.k[1], lo0}};
    key.k[0] += kWeyl0;
    key.k[1] += kWeyl1;
  }
  return ctr;
}

// Uniform float in (0, 1]: 24 random bits, never 0 (so log(u) is finite).
LOCKSTEP_HD float philox_uniform(uint32_t bits) {
  return float((bits >> 8) + 1u) * (1.0f / 16777216.0f);
}

// Uniform double in (0, 1]: 53 random bits of words 0 and 1, never 0 (the sampler's draw).
LOCKSTEP_HD double philox_uniform53(const Philox4& r) {
  const uint64_t bits = (uint64_t(r.v[0]) << 32 | r.v[1]) >> 11;
  return double(bits + 1) * 0x1p-53;
}

// The four random words for (seed, stream, position): stream is e.g. a sample id, position a
// token index. Distinct (stream, position) pairs never share a counter.
LOCKSTEP_HD Philox4 philox_at(uint64_t seed, uint64_t stream, uint64_t position) {
  return philox4x32_10(Philox4{{uint32_t(position), uint32_t(position >> 32), uint32_t(stream),
                                uint32_t(stream >> 32)}},
                       PhiloxKey{{uint32_t(seed), uint32_t(seed >> 32)}});
}

}  // namespace lockstep
