// ops/cpu/lm_head.cpp — CPU reference for ops/lm_head.h (to be written).
