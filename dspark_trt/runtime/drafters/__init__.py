"""Drafters: executors of the DSpark drafter, one family with one base (``base.py``).

* ``base``         the ``DrafterBackend`` interface, the ``BACKENDS`` registry, ``check_export_variant``
* ``torch``        ``TorchDrafterBackend``: the reference modules in PyTorch (CUDA graphs on GPUs)
* ``onnxruntime``  ``OnnxRuntimeDrafterBackend``: an export's graphs in onnxruntime (a checkpoint: exported on
                   demand by the exporter provided from above, ``runtime/exporter.py``)
* ``tensorrt``     ``TensorRTDrafterBackend``: an export's TensorRT engines
"""
