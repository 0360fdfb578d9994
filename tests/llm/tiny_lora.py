"""PEFT LoRA adapters for the tiny Llama (testsupport/tiny_llama.py), as a Hub repository's files.

Written by hand (safetensors is an 8-byte header length, a JSON header and the raw tensors), so
the project's venv builds them without peft: rank-r A and B matrices for q_proj and v_proj of
every layer, random and large enough that an adapter changes what the model answers.
"""

from __future__ import annotations

import json
import struct

import numpy as np

HIDDEN = 128  # testsupport/tiny_llama.py: hidden_size, and 2 key/value heads of 64
LAYERS = 2
TARGETS = ("q_proj", "v_proj")


def safetensors(tensors: dict[str, np.ndarray]) -> bytes:
    header: dict[str, object] = {}
    chunks = []
    offset = 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def adapter_files(seed: int, rank: int = 8) -> dict[str, bytes]:
    """adapter_config.json and adapter_model.safetensors of one random adapter."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(LAYERS):
        for target in TARGETS:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            tensors[f"{prefix}.lora_A.weight"] = rng.normal(0, 0.5, (rank, HIDDEN))
            tensors[f"{prefix}.lora_B.weight"] = rng.normal(0, 0.5, (HIDDEN, rank))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": list(TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "base_model_name_or_path": "tiny-llama",
    }
    return {"adapter_config.json": json.dumps(config).encode(), "adapter_model.safetensors": safetensors(tensors)}
