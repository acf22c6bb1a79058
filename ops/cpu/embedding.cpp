// ops/cpu/embedding.cpp — CPU reference for ops/embedding.h (to be written).
