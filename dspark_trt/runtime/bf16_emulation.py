"""The fp32 **bf16-emulation twin** of a bf16 graph, so onnxruntime's CPU provider can check bf16 exports.

onnxruntime has no CPU kernels for bf16 arithmetic (``MatMul``, ``Mul``, ... report NOT_IMPLEMENTED). The
twin computes every op in fp32 and rounds each result that the original graph holds in bf16 back to bf16
precision (``Cast → bfloat16 → Cast → float``, round-to-nearest-even). That is how PyTorch's CPU bf16 ops
behave (fp32 arithmetic inside an op, bf16 storage between ops), so the twin checks the exported bf16 graph
— its structure, casts, constants and rounding points — against the bf16 reference. It does not model a
GPU kernel's internal accumulation; TensorRT itself is checked on a GPU host.

Rewrite rules (local functions are inlined first, so function bodies are covered too):

* bf16 initializers and ``Constant`` values → fp32 (exact); a bf16 initializer stored as external data (not
  loaded) stays bf16 on disk and is read through a ``Cast`` to fp32 at the top of the graph (exact too), so the
  twin of a multi-GB graph holds no fp32 copy of its weights (run it without constant folding:
  ``OrtGraph`` does);
* ``Cast(to=bf16)`` → ``Cast(to=float)`` followed by the rounding pair; any other op whose output is bf16
  (per shape inference) is followed by the rounding pair;
* bf16 graph inputs and outputs become fp32 (the caller feeds bf16 values upcast, exactly, and casts the
  outputs back: ``OrtGraph`` does both).
"""

from __future__ import annotations

__all__ = ["emulate_bf16"]


def emulate_bf16(model, *, initializer=None, half: str = "bf16", rounding: bool = True):
    """Return the fp32 bf16-emulation twin of ``model`` (an ``onnx.ModelProto``; not modified).

    ``half="fp16"``: the same for an fp16 graph (every fp16 result rounded to fp16 as PyTorch's CPU fp16 ops
    round): onnxruntime's CPU provider runs fp16 graphs by casting most ops to fp32 and dropping the roundings
    between them, so only the twin reproduces an fp16 reference op by op (the Gemma-4 target's validation uses it).

    ``initializer``: how to turn one of the graph's initializers into the twin's (default: bf16 → fp32 in
    memory, or for a bf16 weight kept in external data, a ``Cast`` node reading it as it lies on disk); ``export/bf16_emulation.py: main`` passes one that converts a weight from external data and writes it to the twin's, one
    tensor at a time, so a graph over 2 GiB never has its weights in memory at once.

    ``rounding=False``: the **unrounded twin** — the same ops in fp32 with no rounding between them (``Cast(to=bf16)``
    becomes a no-op cast to fp32): the graph's arithmetic on its bf16 weights, for a check against the reference
    model in fp32 with the same (upcast) weights, where no rounding noise hides a structural difference."""
    import numpy as np
    import onnx
    import onnx.inliner
    from onnx import helper, numpy_helper

    if half not in ("bf16", "fp16"):
        raise ValueError(f"half must be 'bf16' or 'fp16', not {half!r}")
    HALF = onnx.TensorProto.BFLOAT16 if half == "bf16" else onnx.TensorProto.FLOAT16  # the emulated dtype
    F32 = onnx.TensorProto.FLOAT
    twin = onnx.inliner.inline_local_functions(model)
    twin = onnx.shape_inference.infer_shapes(twin, data_prop=False)
    graph = twin.graph

    def to_fp32(tensor):
        if tensor.data_type != HALF:
            return tensor
        array = numpy_helper.to_array(tensor).astype(np.float32)  # bf16 (ml_dtypes) or fp16 → fp32, exact
        return numpy_helper.from_array(array, tensor.name)

    types = {v.name: v.type.tensor_type.elem_type for v in
             list(graph.input) + list(graph.output) + list(graph.value_info)}
    casts = []
    for i, init in enumerate(graph.initializer):
        if initializer is not None:
            graph.initializer[i].CopyFrom(initializer(init))
            continue
        if init.data_type == HALF and init.data_location == onnx.TensorProto.EXTERNAL and not init.raw_data:
            name = init.name
            graph.initializer[i].name = name + f"__{half}"  # read as it lies on disk, cast once per run
            casts.append(helper.make_node("Cast", [name + f"__{half}"], [name], to=F32,
                                          name=name + f"/{half}_to_fp32"))
            continue
        graph.initializer[i].CopyFrom(to_fp32(init))
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        if value.type.tensor_type.elem_type == HALF:
            value.type.tensor_type.elem_type = F32

    nodes = list(casts)
    for node in graph.node:
        rounded = []
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                attr.t.CopyFrom(to_fp32(attr.t))
            elif attr.name == "to" and attr.i == HALF:  # Cast(to=bf16): compute fp32, then round
                attr.i = F32
        if node.op_type == "Constant":
            nodes.append(node)
            continue
        for idx, out in enumerate(node.output):
            if rounding and out and types.get(out) == HALF:
                node.output[idx] = out + "__fp32"
                rounded.append(out)
        nodes.append(node)
        for out in rounded:  # round to bf16 (fp16) precision and keep computing in fp32
            low = out + f"__{half}"
            nodes.append(helper.make_node("Cast", [out + "__fp32"], [low], to=HALF, name=out + f"/to_{half}"))
            nodes.append(helper.make_node("Cast", [low], [out], to=F32, name=out + f"/from_{half}"))
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]  # stale (renamed values); onnxruntime infers its own
    return twin
