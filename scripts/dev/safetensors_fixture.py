#!/usr/bin/env python3
"""The Python `safetensors` library as the oracle for lockstep's reader and writer.

  safetensors_fixture.py write PATH   writes the fixture tests/io/test_safetensors.cpp reads back
                                      (tests/data/safetensors/python_written.safetensors)
  safetensors_fixture.py dump PATH    parses PATH with the library and prints it as JSON:
                                      {"metadata": {...}, "tensors": {name: {dtype, shape, hex}}}

Needs `pip install safetensors numpy`. The raw `serialize_file`/`deserialize` API is used because
numpy has no bfloat16 or float8: those tensors are given as raw bytes with the library's dtype names.
If you change the tensors here, change the expectations in test_safetensors.cpp to match.
"""
import json
import sys

import numpy as np
import safetensors


def fixture():
    """name -> (library dtype name, shape, numpy array holding the raw little-endian bytes)"""
    f32 = np.array([-1.5, -0.0, 0.0, 1.0, 2.5, 3.25, -7.125, 1e-3, 65504.0, 3.4028235e38, -1e-40, 0.1],
                   dtype=np.float32)
    bf16 = np.array([0x3F80, 0xBFC0, 0x7F80, 0x0001, 0x4049], dtype=np.uint16)  # 1, -1.5, inf, min subnormal, 3.140625
    f16 = np.array([1.0, -2.0, 65504.0, 2.0**-24, 0.333251953125, -0.0], dtype=np.float16)
    e4m3 = np.array([0x38, 0xB8, 0x7E, 0x01], dtype=np.uint8)  # 1, -1, 448, 2^-9
    return {
        "model.f32_matrix": ("float32", [3, 4], f32),
        "model.bf16_vector": ("bfloat16", [5], bf16),
        "model.f16_vector": ("float16", [6], f16),
        "model.e4m3_codes": ("float8_e4m3fn", [4], e4m3),
        "model.i64_ids": ("int64", [2, 2], np.array([1, -2, 2**40, -(2**62)], dtype=np.int64)),
        "model.i32_scalar": ("int32", [], np.array(7, dtype=np.int32)),
        "model.f32_empty": ("float32", [0, 3], np.zeros((0, 3), dtype=np.float32)),
    }


def spec(dtype, shape, array):
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.8
        return safetensors.TensorSpec(dtype=dtype, shape=shape, data_ptr=array.ctypes.data,
                                      data_len=array.nbytes)
    return {"dtype": dtype, "shape": shape, "data": array.tobytes()}


def write(path):
    tensors = fixture()  # keeps the arrays alive while the library reads their memory
    specs = {name: spec(*t) for name, t in tensors.items()}
    metadata = {"format": "pt", "written_by": "scripts/dev/safetensors_fixture.py"}
    safetensors.serialize_file(specs, path, metadata=metadata)


def dump(path):
    with open(path, "rb") as f:
        tensors = safetensors.deserialize(f.read())
    with safetensors.safe_open(path, framework="numpy") as f:
        metadata = f.metadata()
    out = {"metadata": metadata, "tensors": {}}
    for name, t in tensors:
        out["tensors"][name] = {"dtype": t["dtype"], "shape": list(t["shape"]), "hex": bytes(t["data"]).hex()}
    json.dump(out, sys.stdout, sort_keys=True)
    print()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "dump"):
        sys.exit(__doc__)
    {"write": write, "dump": dump}[sys.argv[1]](sys.argv[2])
