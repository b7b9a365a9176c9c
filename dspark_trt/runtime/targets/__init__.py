"""Targets: the verifying model of speculative decoding, one family with one base (``base.py``).

* ``base``         the ``Target`` protocol, ``SlotTarget`` (slot bookkeeping), the ``TARGETS`` registry
* ``hf``           ``HFTarget``: a local transformers causal LM
* ``exported``     ``ExportedTarget``: the shared base of the targets that run an export's target graph
* ``onnxruntime``  ``OnnxRuntimeTarget``: ``onnx/target.onnx`` in onnxruntime
* ``tensorrt``     ``TensorRTTarget``: the target's TensorRT engine
"""
