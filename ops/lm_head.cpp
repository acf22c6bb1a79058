// ops/lm_head.cpp — argument checks and backend dispatch for ops/lm_head.h (to be written).
