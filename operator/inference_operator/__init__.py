"""Kubernetes operator that serves models on AMD Instinct GPUs (ROCm)."""

__version__ = "0.1.0"
