// ops/cpu/qkv_rope.cpp — CPU reference for ops/qkv_rope.h (to be written).
