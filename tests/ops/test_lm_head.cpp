// tests/ops/test_lm_head.cpp (to be written)
