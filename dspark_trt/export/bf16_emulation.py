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

from pathlib import Path

__all__ = ["emulate_bf16"]


def emulate_bf16(model, *, initializer=None):
    """Return the fp32 bf16-emulation twin of ``model`` (an ``onnx.ModelProto``; not modified).

    ``initializer``: how to turn one of the graph's initializers into the twin's (default: bf16 → fp32 in
    memory, or for a bf16 weight kept in external data, a ``Cast`` node reading it as it lies on disk); ``main`` passes one that converts a weight from external data and writes it to the twin's, one
    tensor at a time, so a graph over 2 GiB never has its weights in memory at once."""
    import numpy as np
    import onnx
    import onnx.inliner
    from onnx import helper, numpy_helper

    BF16, F32 = onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT
    twin = onnx.inliner.inline_local_functions(model)
    twin = onnx.shape_inference.infer_shapes(twin, data_prop=False)
    graph = twin.graph

    def to_fp32(tensor):
        if tensor.data_type != BF16:
            return tensor
        array = numpy_helper.to_array(tensor).astype(np.float32)  # ml_dtypes bf16 → fp32, exact
        return numpy_helper.from_array(array, tensor.name)

    types = {v.name: v.type.tensor_type.elem_type for v in
             list(graph.input) + list(graph.output) + list(graph.value_info)}
    casts = []
    for i, init in enumerate(graph.initializer):
        if initializer is not None:
            graph.initializer[i].CopyFrom(initializer(init))
            continue
        if init.data_type == BF16 and init.data_location == onnx.TensorProto.EXTERNAL and not init.raw_data:
            name = init.name
            graph.initializer[i].name = name + "__bf16"  # read as it lies on disk, cast once per run
            casts.append(helper.make_node("Cast", [name + "__bf16"], [name], to=F32, name=name + "/bf16_to_fp32"))
            continue
        graph.initializer[i].CopyFrom(to_fp32(init))
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        if value.type.tensor_type.elem_type == BF16:
            value.type.tensor_type.elem_type = F32

    nodes = list(casts)
    for node in graph.node:
        rounded = []
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                attr.t.CopyFrom(to_fp32(attr.t))
            elif attr.name == "to" and attr.i == BF16:  # Cast(to=bf16): compute fp32, then round
                attr.i = F32
        if node.op_type == "Constant":
            nodes.append(node)
            continue
        for idx, out in enumerate(node.output):
            if out and types.get(out) == BF16:
                node.output[idx] = out + "__fp32"
                rounded.append(out)
        nodes.append(node)
        for out in rounded:  # round to bf16 precision and keep computing in fp32
            nodes.append(helper.make_node("Cast", [out + "__fp32"], [out + "__bf16"], to=BF16, name=out + "/to_bf16"))
            nodes.append(helper.make_node("Cast", [out + "__bf16"], [out], to=F32, name=out + "/from_bf16"))
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]  # stale (renamed values); onnxruntime infers its own
    return twin


def main(argv: list[str] | None = None) -> int:
    """``python -m dspark_trt.export.bf16_emulation IN.onnx OUT.onnx [--force]``: write the twin of a bf16 graph,
    e.g. for ``polygraphy run OUT.onnx --onnxrt`` (onnxruntime's CPU provider cannot run the bf16 graph)."""
    import argparse
    import contextlib
    import sys

    from ..atomic import atomic_output_file, check_output_file
    from ..errors import DSparkTrtError

    p = argparse.ArgumentParser(prog="python -m dspark_trt.export.bf16_emulation", allow_abbrev=False,
                                description=main.__doc__.split(":", 1)[1].strip())
    p.add_argument("model", metavar="IN.onnx", help="a bf16 graph, e.g. OUT/onnx/draft.onnx of a bf16 export")
    p.add_argument("out", metavar="OUT.onnx", help="where to write the fp32 twin (weights inside, or in "
                   "OUT.onnx.data beside it when they exceed 1.5 GiB)")
    p.add_argument("--force", action="store_true", help="replace an existing OUT.onnx")
    args = p.parse_args(argv)
    try:
        import onnx

        from .external_data import check_external_data

        check_output_file(args.out, force=args.force)
        try:
            model = onnx.load(args.model, load_external_data=False)  # the weights are read one at a time below
        except Exception as e:  # noqa: BLE001 - onnx raises many kinds for an unreadable file
            raise DSparkTrtError(f"cannot read {args.model} as an ONNX model ({type(e).__name__}); pass an exported "
                                 f".onnx file") from None
        check_external_data(model, Path(args.model).parent, args.model)
        bf16 = onnx.TensorProto.BFLOAT16
        if not any(t.data_type == bf16 for t in model.graph.initializer) and not any(
                v.type.tensor_type.elem_type == bf16 for v in list(model.graph.input) + list(model.graph.output)):
            raise DSparkTrtError(f"{args.model} has no bf16 weights or I/O: run it as it is")
        out = Path(args.out)
        external = _twin_bytes(model) > TWIN_EXTERNAL_BYTES
        data = out.with_name(out.name + ".data")
        if external:
            check_output_file(data, force=args.force)
        with contextlib.ExitStack() as stack:  # the data file (if any) is in place before the graph that needs it
            sink = None
            if external:
                sink = stack.enter_context(open(stack.enter_context(atomic_output_file(data)), "wb"))
            convert = _StreamedInitializers(Path(args.model).parent, sink, data.name)
            twin = emulate_bf16(model, initializer=convert)
            if sink is not None:
                sink.close()
            stack.close()
            with atomic_output_file(out) as tmp:
                tmp.write_bytes(twin.SerializeToString())
    except DSparkTrtError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}{f' (+ {Path(args.out).name}.data)' if external else ''}: the fp32 bf16-emulation twin "
          f"of {args.model}")
    return 0


TWIN_EXTERNAL_BYTES = 3 << 29  # 1.5 GiB of twin weights: above, they go to OUT.onnx.data (protobuf caps at 2 GiB)


def _twin_bytes(model) -> int:
    """The twin's initializer bytes (bf16 → fp32 doubles them), from dims and types only."""
    import onnx

    total = 0
    for t in model.graph.initializer:
        n = 1
        for d in t.dims:
            n *= int(d)
        bf16 = t.data_type == onnx.TensorProto.BFLOAT16
        size = 4 if bf16 else onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        total += n * size
    return total


class _StreamedInitializers:
    """``emulate_bf16``'s ``initializer``: read one weight (inline or external data beside the source graph), bf16
    → fp32, and — with a ``sink`` — append it to the twin's data file as an external tensor (else keep it
    inline)."""

    def __init__(self, src_dir: Path, sink, location: str):
        self.src_dir, self.sink, self.location, self.offset = src_dir, sink, location, 0

    def __call__(self, tensor):
        import numpy as np
        import onnx
        from onnx import external_data_helper, numpy_helper

        loaded = onnx.TensorProto()
        loaded.CopyFrom(tensor)
        if external_data_helper.uses_external_data(loaded):
            external_data_helper.load_external_data_for_tensor(loaded, str(self.src_dir))
            loaded.data_location = onnx.TensorProto.DEFAULT
            del loaded.external_data[:]
        array = numpy_helper.to_array(loaded)
        if loaded.data_type == onnx.TensorProto.BFLOAT16:
            array = array.astype(np.float32)  # exact
        out = numpy_helper.from_array(array, tensor.name)
        del loaded, array
        if self.sink is None or len(out.raw_data) < 1024:
            return out
        pad = -self.offset % 4096  # page-aligned: onnxruntime can map the weights
        self.sink.write(bytes(pad))
        self.offset += pad
        self.sink.write(out.raw_data)
        external_data_helper.set_external_data(out, self.location, offset=self.offset, length=len(out.raw_data))
        self.offset += len(out.raw_data)
        out.ClearField("raw_data")
        out.data_location = onnx.TensorProto.EXTERNAL
        return out


if __name__ == "__main__":
    raise SystemExit(main())
