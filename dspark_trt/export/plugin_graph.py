"""The draft graph as full TensorRT must see it to pick our plugin instead of the local function.

The exported ``draft.onnx`` carries the ``dspark::DSparkTopKMarkov`` node *and* a same-named ONNX local
function (so onnxruntime and TensorRT-RTX run it from standard ops). For a TensorRT build with the
quickly-deployable AOT plugin (docs/export.md, Engines) we post-edit a copy with onnx-graphsurgeon:

* drop the local function, so no parser version can prefer it over the plugin;
* set ``aot = 1`` on the node, so TensorRT uses the plugin's ahead-of-time implementation (the PTX is
  embedded in the engine: no Python and no ``.so`` at run time);
* keep ``plugin_namespace`` / ``plugin_version`` (set by the exporter), which the parser needs to look the
  plugin up before anything else.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import DSparkTrtError
from ..plugins.contract import OP_DOMAIN, OP_NAME, PLUGIN_NAMESPACE, PLUGIN_VERSION, UNION_OP_NAME

_OPS = (OP_NAME, UNION_OP_NAME)  # the walk node: plain, or the candidate union (--markov-topm M)

__all__ = ["plugin_graph", "custom_nodes"]


def custom_nodes(model) -> list:
    """The ``DSparkTopKMarkov`` / ``DSparkTopKMarkovUnion`` nodes of an ``onnx.ModelProto`` graph."""
    return [n for n in model.graph.node if n.op_type in _OPS and n.domain == OP_DOMAIN]


def plugin_graph(src: str | Path, dst: str | Path) -> Path:
    """Write ``dst``: ``src`` without the op's local function and with ``aot=1`` on its node."""
    import onnx
    import onnx_graphsurgeon as gs

    from onnx_graphsurgeon.logger import G_LOGGER

    G_LOGGER.severity = G_LOGGER.ERROR  # it warns that bf16 has no NumPy type (and keeps it, as we want)
    model = onnx.load(str(src))
    if not custom_nodes(model):
        raise DSparkTrtError(f"{src} has no {OP_DOMAIN}::{OP_NAME} node (a dense --topk off export needs no plugin); "
                             f"build it without the plugin")
    graph = gs.import_onnx(model)
    for node in graph.nodes:
        if node.op in _OPS and node.domain == OP_DOMAIN:
            node.attrs["aot"] = 1
            node.attrs["plugin_namespace"] = PLUGIN_NAMESPACE
            node.attrs["plugin_version"] = PLUGIN_VERSION
    graph.functions = [f for f in graph.functions if not (f.name in _OPS and f.domain == OP_DOMAIN)]
    out = gs.export_onnx(graph)
    out.metadata_props.extend(model.metadata_props)
    dst = Path(dst)
    onnx.save(out, str(dst))
    return dst
