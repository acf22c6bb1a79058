// ops/embedding.cpp — argument checks and backend dispatch for ops/embedding.h (to be written).
