"""Checkpoint → ONNX graphs → TensorRT / TensorRT-RTX engines → export directory with a manifest.

ONNX (this package so far):

* ``graphs``        the ``context`` and ``draft`` graphs from the reference modules (``torch.onnx.export``)
* ``topk_op``       the DSparkTopKMarkov node as a torch custom op + its ONNX translation
* ``onnx``          lazy loaders: ``OnnxFromCheckpoint``, ``OnnxFromDrafter``, ``SaveOnnx``, ``OnnxFromDir``,
                    ``cached_onnx_export``
* ``validate``      onnxruntime vs the reference, dtype-aware tolerances; ``ValidationMismatch`` (exit 3)
* ``on_demand``     the exporter the runtime's onnxruntime drafter calls for a checkpoint (``runtime/exporter.py``)
* ``bf16_emulation`` ``python -m dspark_trt.export.bf16_emulation``: write a bf16 graph's fp32 twin
* ``pipeline``      ``dspark-export``: checkpoint → ONNX → PTX → engines → export directory (``artifact/``)
* ``engine_build``  TensorRT / TensorRT-RTX engines from the graphs

What an export directory holds, and its one manifest, is ``artifact/`` (below ``runtime/`` and this package);
the graphs run in onnxruntime through the runtime's own code (``runtime/ort_session.py``,
``runtime/drafter_graphs.py``), so validation checks what will serve.
"""
