// tests/ops/test_layer_ops.cpp (to be written)
