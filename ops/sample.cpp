// ops/sample.cpp — argument checks and backend dispatch for ops/sample.h.
#include "ops/sample.h"

#include <cmath>
#include <cstring>

#include "ops/act_check.h"
#include "ops/sample_backends.h"

namespace lockstep {

namespace {

// The values of CPU specs (CUDA ones are not read on the host, which would need a sync: the
// kernel turns a bad spec into token −1 and a NaN logprob).
void check_spec_values(const Tensor& specs, int64_t rows) {
  const int64_t* words = specs.data_as<int64_t>();
  for (int64_t d = 0; d < specs.dim(0); ++d) {
    SampleSpec s;
    std::memcpy(static_cast<void*>(&s), words + d * kSampleSpecWords, sizeof s);
    LOCKSTEP_CHECK(s.row >= 0 && s.row < rows, "sample_tokens: specs[", d, "].row = ", s.row,
                   " is outside the logits rows [0, ", rows, ")");
    LOCKSTEP_CHECK(std::isfinite(s.temperature) && s.temperature >= 0, "sample_tokens: specs[", d,
                   "].temperature must be finite and >= 0, got ", s.temperature);
    LOCKSTEP_CHECK(s.top_p > 0 && s.top_p <= 1, "sample_tokens: specs[", d,
                   "].top_p must be in (0, 1], got ", s.top_p);
    LOCKSTEP_CHECK(s.top_k >= 0, "sample_tokens: specs[", d,
                   "].top_k must be >= 0 (0: no limit), got ", s.top_k);
  }
}

}  // namespace

Tensor sample_specs_tensor(std::span<const SampleSpec> specs) {
  Tensor t = Tensor::empty({int64_t(specs.size()), kSampleSpecWords}, DType::i64);
  if (!specs.empty()) std::memcpy(t.data(), specs.data(), specs.size_bytes());
  return t;
}

void sample_tokens(Tensor& tokens, Tensor& logprobs, const Tensor& logits, const Tensor& specs) {
  const Device d = logits.device();
  check_tensor(logits, "sample_tokens: logits", DType::f32, d);
  LOCKSTEP_CHECK(logits.rank() == 2 && logits.dim(1) > 0 && logits.dim(1) <= kMaxSampleVocab,
                 "sample_tokens: logits: expected a 2-D tensor [S, V] with 0 < V <= ",
                 kMaxSampleVocab, ", got ", logits.describe());
  check_tensor(specs, "sample_tokens: specs", DType::i64, d);
  LOCKSTEP_CHECK(specs.rank() == 2 && specs.dim(1) == kSampleSpecWords,
                 "sample_tokens: specs: expected [D, ", kSampleSpecWords,
                 "] (a SampleSpec per row, sample_specs_tensor), got ", specs.describe());
  LOCKSTEP_CHECK(reinterpret_cast<uintptr_t>(specs.data()) % alignof(SampleSpec) == 0,
                 "sample_tokens: specs: the data must be ", alignof(SampleSpec),
                 "-byte aligned (a view at an odd offset?)");
  const int64_t D = specs.dim(0);
  check_tensor(tokens, "sample_tokens: tokens", DType::i32, d);
  check_shape(tokens, "sample_tokens: tokens", {D});
  check_tensor(logprobs, "sample_tokens: logprobs", DType::f32, d);
  check_shape(logprobs, "sample_tokens: logprobs", {D});
  if (D == 0) return;
  if (d == Device::cuda) {
#if LOCKSTEP_HAS_CUDA
    return cuda::sample_tokens(tokens, logprobs, logits, specs);
#else
    LOCKSTEP_NO_CUDA_OP("sample_tokens");
#endif
  }
  check_spec_values(specs, logits.dim(0));
  cpu::sample_tokens(tokens, logprobs, logits, specs);
}

}  // namespace lockstep
