// ops/head_layout.cpp
#include "ops/head_layout.h"

#include "core/error.h"

namespace lockstep {

void check_head_layout(const HeadLayout& l) {
  LOCKSTEP_CHECK(l.q_heads > 0 && l.kv_heads > 0 && l.head_dim > 0,
                 "attention heads: q_heads, kv_heads and head_dim must be positive, got ", l.q_heads,
                 ", ", l.kv_heads, ", ", l.head_dim);
  LOCKSTEP_CHECK(l.q_heads % l.kv_heads == 0, "attention heads: q_heads (", l.q_heads,
                 ") must be a multiple of kv_heads (", l.kv_heads, ")");
  LOCKSTEP_CHECK(l.head_dim % 2 == 0, "attention heads: head_dim must be even for RoPE, got ",
                 l.head_dim);
}

}  // namespace lockstep
