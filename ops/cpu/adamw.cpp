// ops/cpu/adamw.cpp — CPU reference for ops/adamw.h (to be written).
