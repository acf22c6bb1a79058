// ops/cpu/elementwise.cpp — CPU reference for ops/elementwise.h (to be written).
