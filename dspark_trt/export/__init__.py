"""Checkpoint → ONNX graphs → TensorRT / TensorRT-RTX engines → export directory with a manifest.

ONNX (this package so far):

* ``graphs``        the ``context`` and ``draft`` graphs from the reference modules (``torch.onnx.export``)
* ``topk_op``       the DSparkTopKMarkov node as a torch custom op + its ONNX translation
* ``onnx``          lazy loaders: ``OnnxFromCheckpoint``, ``OnnxFromDrafter``, ``SaveOnnx``, ``OnnxFromDir``,
                    ``cached_onnx_export``
* ``validate``      onnxruntime vs the reference, dtype-aware tolerances; ``ValidationMismatch`` (exit 3)
* ``ort_session``   ``OrtGraph``: one exported graph in onnxruntime, torch tensors in and out
* ``bf16_emulation`` the fp32 twin that lets onnxruntime's CPU provider check bf16 graphs
"""
