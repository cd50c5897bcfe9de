"""A synthetic checkpoint for tests and the bench: safetensors shards (the format's own layout:
an 8-byte header length, a JSON header, the tensors' bytes), the index that names each tensor's
shard, and a config.json. Random bytes, so that no piece hashes like another."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path


def write_shard(path: Path, tensors: dict[str, int]) -> None:
    """One .safetensors file of float16 tensors of the given byte sizes (even numbers)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, size in tensors.items():
        header[name] = {"dtype": "F16", "shape": [size // 2],
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for size in tensors.values():
            f.write(os.urandom(size))


def make_checkpoint(folder: Path, total_bytes: int, shards: int = 4, layers: int = 4,
                    config: dict | None = None) -> Path:
    """A checkpoint of about total_bytes in `shards` shards, with its index and config (a small
    Llama's unless `config` is given)."""
    folder.mkdir(parents=True, exist_ok=True)
    per_tensor = max(2, (total_bytes // (shards * layers)) // 2 * 2)
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {f"model.layers.{s * layers + n}.mlp.weight": per_tensor for n in range(layers)}
        write_shard(folder / name, tensors)
        weight_map.update(dict.fromkeys(tensors, name))
    index = {"metadata": {"total_size": per_tensor * shards * layers}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    config = config or {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                        "num_hidden_layers": shards * layers, "hidden_size": 64,
                        "torch_dtype": "float16"}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder
