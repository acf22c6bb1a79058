// tests/ops/test_attention.cpp (to be written)
