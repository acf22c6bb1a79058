// ops/qkv_rope.cpp — argument checks and backend dispatch for ops/qkv_rope.h (to be written).
