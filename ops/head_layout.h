// ops/head_layout.h — how the fused q/k/v projection lays out attention heads in one row.
//
//   qkv [T, (q_heads + 2·kv_heads) · head_dim]:
//     q heads  h = 0 .. q_heads−1     at columns h·head_dim
//     k heads  h = 0 .. kv_heads−1    at columns (q_heads + h)·head_dim
//     v heads  h = 0 .. kv_heads−1    at columns (q_heads + kv_heads + h)·head_dim
//
// Grouped-query attention: query head h reads kv head h / (q_heads / kv_heads).
#pragma once

#include <cstdint>

namespace lockstep {

struct HeadLayout {
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;

  int64_t q_width() const { return q_heads * head_dim; }
  int64_t kv_width() const { return kv_heads * head_dim; }
  int64_t qkv_width() const { return (q_heads + 2 * kv_heads) * head_dim; }
  int64_t k_offset() const { return q_width(); }
  int64_t v_offset() const { return q_width() + kv_width(); }
  int64_t group() const { return q_heads / kv_heads; }
};

// Throws unless the layout is usable: all positive, q_heads % kv_heads == 0, head_dim even.
void check_head_layout(const HeadLayout& layout);

}  // namespace lockstep
