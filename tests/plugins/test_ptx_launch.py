"""Launching the AOT PTX the way TensorRT does: the parameter layout here, the real launch on a GPU host."""

from __future__ import annotations

import ctypes

from dspark_trt.plugins.ptx_launch import aot_kernel_params


def test_parameters_follow_tensorrts_aot_order():
    params = aot_kernel_params([0x1000 + i for i in range(11)], [151936, 32000], [0x2000, 0x3000, 0x4000], 2)
    assert [type(p) for p in params] == [ctypes.c_uint64] * 11 + [ctypes.c_int32] * 2 + [ctypes.c_uint64] * 5
    assert [p.value for p in params[11:13]] == [151936, 32000]
    assert [p.value for p in params[13:16]] == [0x2000, 0x3000, 0x4000]
    assert [p.value for p in params[16:]] == [0, 0]  # Triton's scratch pointers: null
