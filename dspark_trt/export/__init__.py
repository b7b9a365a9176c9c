"""Checkpoint → ONNX graphs → TensorRT / TensorRT-RTX engines → export directory with a manifest."""
