// ops/cpu/attention.cpp — CPU reference for ops/attention.h (to be written).
