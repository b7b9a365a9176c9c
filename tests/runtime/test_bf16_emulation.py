"""The bf16-emulation twin: onnxruntime CPU runs bf16 graphs with PyTorch's CPU bf16 rounding."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.onnx


class Block(torch.nn.Module):
    """Linear → RMSNorm-like scaling → softmax-weighted sum: bf16 matmuls, elementwise ops and casts."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(37, 24, generator=g) * 0.2)
        self.scale = torch.nn.Parameter(1 + 0.1 * torch.randn(24, generator=g))

    def forward(self, x):  # [B, 37] bf16
        h = x @ self.w  # [B, 24]
        h32 = h.float()
        h = (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(h.dtype) * self.scale
        return h * torch.softmax(h.float(), -1).to(h.dtype), h.float().sum(-1)


def ulps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bf16 units in the last place (both tensors bf16)."""
    ia, ib = a.view(torch.int16).to(torch.int32), b.view(torch.int16).to(torch.int32)
    return (ia - ib).abs()


def test_twin_matches_torch_bf16_rounding():
    import onnx

    from dspark_trt.runtime.bf16_emulation import emulate_bf16
    from dspark_trt.runtime.ort_session import OrtGraph
    from dspark_trt.torch_to_onnx import torch_onnx_export

    block = Block().to(torch.bfloat16)
    x = torch.randn(5, 37, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    program = torch_onnx_export(block, (x,), input_names=["x"], output_names=["y", "s"],
                                dynamic_shapes=({0: torch.export.Dim("B")},))
    proto = program.model_proto
    twin = emulate_bf16(proto)
    bf16 = onnx.TensorProto.BFLOAT16
    assert all(i.data_type != bf16 for i in twin.graph.initializer)
    assert {n.op_type for n in twin.graph.node if any(a.name == "to" and a.i == bf16 for a in n.attribute)} == {"Cast"}

    graph = OrtGraph(proto)
    assert graph.emulated_bf16
    out = graph.run({"x": x})
    y_ref, s_ref = block(x)
    assert out["y"].dtype == torch.bfloat16 and out["s"].dtype == torch.float32
    apart = ulps_apart(out["y"], y_ref)
    assert (apart == 0).float().mean() >= 0.95 and int(apart.max()) <= 1  # same rounding points as torch
    torch.testing.assert_close(out["s"], s_ref, atol=1e-5, rtol=1e-5)


def test_the_unrounded_twin_is_the_fp32_model_and_not_the_bf16_one():
    """``rounding=False``: the graph's ops in fp32 without the rounding pairs — the same block in fp32 on the upcast
    weights (to summation order), fp32 outputs; and (the control) not torch's bf16 results: the twin's rounding is
    what makes the bf16 comparison meaningful."""
    import copy

    import onnx

    from dspark_trt.runtime.bf16_emulation import emulate_bf16
    from dspark_trt.runtime.ort_session import OrtGraph
    from dspark_trt.torch_to_onnx import torch_onnx_export

    block = Block().to(torch.bfloat16)
    x = torch.randn(64, 37, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    proto = torch_onnx_export(block, (x,), input_names=["x"], output_names=["y", "s"]).model_proto
    twin = emulate_bf16(proto, rounding=False)
    bf16 = onnx.TensorProto.BFLOAT16
    assert not any(n.name.endswith(("/to_bf16", "/from_bf16")) for n in twin.graph.node)
    assert not any(a.name == "to" and a.i == bf16 for n in twin.graph.node for a in n.attribute)
    out = OrtGraph(proto, rounding=False).run({"x": x})
    assert out["y"].dtype == torch.float32
    y32, s32 = copy.deepcopy(block).float()(x.float())  # the same weights, upcast
    torch.testing.assert_close(out["y"], y32, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["s"], s32, atol=1e-5, rtol=1e-5)
    assert int(ulps_apart(out["y"].to(torch.bfloat16), block(x)[0]).max()) > 1


def test_the_fp16_twin_rounds_as_torch_where_onnxruntimes_own_fp16_does_not():
    """``emulate_fp16=True``: an fp16 graph as its fp32 twin rounds every fp16 result as PyTorch's CPU fp16 ops
    do (the Gemma-4 target's fp16 validation compares op by op with transformers); onnxruntime's own fp16 run
    casts ops to fp32 and drops roundings between them, so it differs from torch (the twin is what matches)."""
    from dspark_trt.runtime.ort_session import OrtGraph
    from dspark_trt.torch_to_onnx import torch_onnx_export

    block = Block().to(torch.float16)
    x = torch.randn(64, 37, generator=torch.Generator().manual_seed(1)).to(torch.float16)
    proto = torch_onnx_export(block, (x,), input_names=["x"], output_names=["y", "s"]).model_proto
    y_ref, s_ref = block(x)
    twin = OrtGraph(proto, emulate_fp16=True)
    assert twin.emulated_fp16 and not twin.emulated_bf16 and twin.input_dtype("x") == torch.float32
    out = twin.run({"x": x})
    assert out["y"].dtype == torch.float16 and torch.equal(out["y"], y_ref)  # bit for bit
    torch.testing.assert_close(out["s"], s_ref, atol=1e-4, rtol=1e-4)
    native = OrtGraph(proto)
    assert not native.emulated_fp16 and native.input_dtype("x") == torch.float16
    assert not torch.equal(native.run({"x": x})["y"], y_ref)
