"""The DSparkTopKMarkov op in all its forms: Triton kernel, AOT PTX, TensorRT plugin, ONNX schema."""
