// ops/elementwise.cpp — argument checks and backend dispatch for ops/elementwise.h (to be written).
