"""The draft graph as full TensorRT must see it to pick our plugin instead of the local function.

The exported ``draft.onnx`` carries the ``dspark::DSparkTopKMarkov`` node *and* a same-named ONNX local
function (so onnxruntime and TensorRT-RTX run it from standard ops). For a TensorRT build with the
quickly-deployable AOT plugin (docs/export.md, Engines) we post-edit a copy of the graph's nodes:

* drop the local function, so no parser version can prefer it over the plugin;
* set ``aot = 1`` on the node, so TensorRT uses the plugin's ahead-of-time implementation (the PTX is
  embedded in the engine: no Python and no ``.so`` at run time);
* keep ``plugin_namespace`` / ``plugin_version`` (set by the exporter), which the parser needs to look the
  plugin up before anything else.

The weights are never loaded: the graph is read with ``load_external_data=False`` and only the node and the
function list change, so a draft graph over protobuf's 2 GiB cap (its initializers in ``draft.onnx.data``) is
edited in the time it takes to read its nodes. The plugin graph references the *same* data file
when it is written beside ``draft.onnx`` (as the export does), so the export holds one copy of the weights;
another directory needs ``copy_weights=True`` (``artifact/external_data.py``: onnx accepts no link and no path
outside the graph's directory). A small graph with its weights inside keeps them inside.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import DSparkTrtError
from ..plugins.contract import HEAD_OPS, OP_DOMAIN, OP_NAME, PLUGIN_NAMESPACE, PLUGIN_VERSION, UNION_OP_NAME

#: the walk node: plain, the candidate union (--markov-topm M), or a gated / RNN head's
_OPS = (OP_NAME, UNION_OP_NAME) + tuple(name for name, _ in HEAD_OPS.values() if name != OP_NAME)

__all__ = ["plugin_graph", "custom_nodes"]


def custom_nodes(model) -> list:
    """The walk nodes (``DSparkTopKMarkov`` / ``…Union`` / ``…Gated`` / ``…RNN``) of an ``onnx.ModelProto``."""
    return [n for n in model.graph.node if n.op_type in _OPS and n.domain == OP_DOMAIN]


def plugin_graph(src: str | Path, dst: str | Path, *, copy_weights: bool = False) -> Path:
    """Write ``dst``: ``src`` without the op's local function and with ``aot=1`` on its node (weights untouched)."""
    from ..atomic import atomic_write_bytes
    from ..artifact.external_data import load_graph_only, share_external_data

    src, dst = Path(src), Path(dst)
    model = load_graph_only(src)  # nodes, I/O and external-data references; inline weights of a small graph
    nodes = custom_nodes(model)
    if not nodes:
        raise DSparkTrtError(f"{src} has no {OP_DOMAIN}::{OP_NAME} node (a dense --topk off export needs no plugin); "
                             f"build it without the plugin")
    for node in nodes:
        for name, value in (("aot", 1), ("plugin_namespace", PLUGIN_NAMESPACE), ("plugin_version", PLUGIN_VERSION)):
            _set_attribute(node, name, value)
    keep = [f for f in model.functions if not (f.name in _OPS and f.domain == OP_DOMAIN)]
    del model.functions[:]
    model.functions.extend(keep)
    share_external_data(model, src.parent, dst.parent, copy=copy_weights)  # beside src: one copy on disk
    atomic_write_bytes(dst, model.SerializeToString())  # the graph only: small whenever its weights are external
    return dst


def _set_attribute(node, name: str, value) -> None:
    """Set (or replace, in place) one attribute of a ``NodeProto``."""
    from onnx import helper

    attr = helper.make_attribute(name, value)
    for existing in node.attribute:
        if existing.name == name:
            existing.CopyFrom(attr)
            return
    node.attribute.append(attr)
