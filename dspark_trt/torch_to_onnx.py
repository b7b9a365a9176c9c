"""One quiet, consistent call into PyTorch's ONNX exporter (``torch.onnx.export(..., dynamo=True)``).

Shared by the op's local function (``plugins/onnx_op.py``) and the drafter graphs (``export/graphs.py``),
so both come out of the same exporter with the same default-domain opset.
"""

from __future__ import annotations

import contextlib
import logging
import warnings

import torch

__all__ = ["OPSET", "torch_onnx_export"]

OPSET = 21  # default-domain opset of every graph we write (TensorRT 10.x/11.x and TensorRT-RTX parse it)


@contextlib.contextmanager
def _quiet():
    """Silence the exporter's chatter (axis-renaming and torchvision-registry warnings)."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.onnx._internal.exporter._registration",
                                               "torch.export", "torch._export", "onnxscript", "onnx_ir")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def torch_onnx_export(module: torch.nn.Module, args: tuple, *, input_names: list[str], output_names: list[str],
                      dynamic_shapes=None, custom_translation_table=None, opset: int | None = None):
    """``torch.onnx.export`` with the dynamo exporter, optimisation on; returns the ``ONNXProgram``."""
    with _quiet(), torch.no_grad():
        return torch.onnx.export(
            module.eval(), args, dynamo=True, input_names=input_names, output_names=output_names,
            dynamic_shapes=dynamic_shapes, custom_translation_table=custom_translation_table,
            opset_version=opset or OPSET, optimize=True, verbose=False, report=False,
        )
