"""Model server for InferenceService pods: ONNX Runtime / torch backends behind
dynamic batching, with a simple JSON API and the Open Inference Protocol (v2)."""

__version__ = "0.1.0"
