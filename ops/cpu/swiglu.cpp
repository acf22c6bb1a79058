// ops/cpu/swiglu.cpp — CPU reference for ops/swiglu.h (to be written).
