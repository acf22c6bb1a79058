// ops/rmsnorm.cpp — argument checks and backend dispatch for ops/rmsnorm.h (to be written).
