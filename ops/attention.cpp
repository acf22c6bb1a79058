// ops/attention.cpp — argument checks and backend dispatch for ops/attention.h (to be written).
