"""``python -m dspark_trt.export.bf16_emulation IN.onnx OUT.onnx [--unrounded]``: write the fp32 bf16-emulation twin
of a bf16 graph (``runtime/bf16_emulation.py``), e.g. for ``polygraphy run OUT.onnx --onnxrt``; ``--unrounded``: its
ops in fp32 without the roundings, to compare with a model in fp32. The weights are converted one tensor at a time,
so a graph over 2 GiB never has its weights in memory at once.
"""

from __future__ import annotations

from pathlib import Path

from ..runtime.bf16_emulation import emulate_bf16

__all__ = ["main"]


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
    p.add_argument("--unrounded", action="store_true",
                   help="the unrounded twin: the ops in fp32 with no rounding between them, to compare with the model "
                        "in fp32 on the same (upcast) weights")
    args = p.parse_args(argv)
    try:
        import onnx

        from ..artifact.external_data import check_external_data

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
            twin = emulate_bf16(model, initializer=convert, rounding=not args.unrounded)
            if sink is not None:
                sink.close()
            stack.close()
            with atomic_output_file(out) as tmp:
                tmp.write_bytes(twin.SerializeToString())
    except DSparkTrtError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    kind = "unrounded fp32 twin" if args.unrounded else "fp32 bf16-emulation twin"
    print(f"wrote {args.out}{f' (+ {Path(args.out).name}.data)' if external else ''}: the {kind} of {args.model}")
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
