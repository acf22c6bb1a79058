// ops/swiglu.cpp — argument checks and backend dispatch for ops/swiglu.h (to be written).
