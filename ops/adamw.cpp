// ops/adamw.cpp — argument checks and backend dispatch for ops/adamw.h (to be written).
