// ops/cuda/attention_cudnn_index.h — the per-sequence tensors cuDNN's ragged SDPA reads
// (ops/cuda/attention_cudnn.cpp), made on the device from cu_seqlens, and the guard for a
// cu_seqlens that does not split the T rows into sequences. cu_seqlens is never read on the host:
// that would need a sync.
//
// For `batch` ≥ S sequences (S = cu_seqlens' length − 1; sequences S..batch−1 are empty, so one
// execution plan serves every S up to `batch`), with c = cu_seqlens:
//   seq_len[b]    = c[b + 1] − c[b]                      i32 [batch]
//   offsets[k][b] = c[min(b, S)] · row_elements[k]       i64 [batch + 1], k = 0, 1, 2
// (cuDNN's ragged offsets count elements from a tensor's base pointer to its sequence's first row;
// the three row sizes are those of the qkv, out and lse rows.)
// A cu_seqlens that does not start at 0, decreases, or does not end at `rows` (T) turns every
// length and offset into 0 — cuDNN then reads and writes nothing — and sets *invalid to 1, after
// which fill_if_invalid writes NaN over the outputs so that the trainer's non-finite check sees it.
// Every array is 16-byte aligned (cuDNN's default assumption for its tensors).
#pragma once

#include <cstdint>

namespace lockstep::cudnn {

struct SdpaIndex {
  int32_t* seq_len = nullptr;
  int64_t* offsets[3] = {};
  int32_t* invalid = nullptr;
};

// Launches on current_stream(). cu_seqlens: device i32 [sequences + 1].
void make_sdpa_index(const SdpaIndex& index, const int32_t* cu_seqlens, int64_t sequences,
                     int64_t batch, int64_t rows, const int64_t (&row_elements)[3]);

// Up to two device ranges of 4-byte words (f32, or pairs of bf16) set to all-ones bits — NaN in
// both f32 and bf16 — when *invalid is set; a range with words = 0 is skipped.
struct FillRanges {
  void* data[2] = {};
  int64_t words[2] = {};
};
void fill_if_invalid(const int32_t* invalid, const FillRanges& ranges);

}  // namespace lockstep::cudnn
