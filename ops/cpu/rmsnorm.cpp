// ops/cpu/rmsnorm.cpp — CPU reference for ops/rmsnorm.h (to be written).
