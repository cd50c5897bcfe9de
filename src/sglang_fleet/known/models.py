"""Models and GPUs the controller knows without reading a node: data/models.yml (the parts of a
checkpoint's config.json that decide which parallel layouts load, and its size) and
data/gpus.yml (memory per GPU). The checks themselves are module_utils/gpu/modelfit's, the same ones
the node check runs on the node's own config.json."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from sglang_fleet.known.reviewed import data_yaml

GB = 10**9
MIB = 1 << 20


@dataclass(frozen=True)
class KnownModel:
    name: str
    aliases: tuple[str, ...]
    architecture: str
    attention: str  # MLA or MHA
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    n_routed_experts: int | None
    checkpoint_gb: int

    @property
    def shape(self) -> dict[str, Any]:
        """The shape module_utils/gpu/modelfit.model_shape reads from a config.json."""
        return {"architecture": self.architecture, "attention": self.attention,
                "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads,
                "num_hidden_layers": self.num_hidden_layers,
                "n_routed_experts": self.n_routed_experts}

    @property
    def checkpoint_bytes(self) -> int:
        return self.checkpoint_gb * GB

    def config_json(self) -> dict[str, Any]:
        """A config.json with this model's shape (the simulator's stand-in model carries it,
        so the node check and the simulator read what a real checkpoint would give them)."""
        config: dict[str, Any] = {
            "architectures": [self.architecture],
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "num_hidden_layers": self.num_hidden_layers,
        }
        if self.n_routed_experts:
            config["n_routed_experts"] = self.n_routed_experts
        if self.attention == "MLA":
            config["kv_lora_rank"] = 512
        return config


@cache
def known_models() -> dict[str, KnownModel]:
    raw = data_yaml("models.yml")
    return {name: KnownModel(name=name, aliases=tuple(entry.get("aliases") or ()),
                             **{k: v for k, v in entry.items() if k != "aliases"})
            for name, entry in raw.items()}


@cache
def _by_name() -> dict[str, KnownModel]:
    out: dict[str, KnownModel] = {}
    for model in known_models().values():
        for name in (model.name, *model.aliases):
            out[name.lower()] = model
    return out


def known_model(model_path: str | None) -> KnownModel | None:
    """The known model a model path or hub id names: its full text, else its last part."""
    if not model_path:
        return None
    text = model_path.rstrip("/").lower()
    return _by_name().get(text) or _by_name().get(text.rsplit("/", 1)[-1])


@cache
def _gpu_memory_mib() -> dict[str, int]:
    return {k.lower(): v for k, v in data_yaml("gpus.yml").items()}


def gpu_memory_bytes(gpu_model: str | None, memory_gb: float | None = None) -> int | None:
    """Memory per GPU: the inventory's figure (GB), else the table's for the named model."""
    if memory_gb:
        return int(memory_gb * GB)
    name = (gpu_model or "").lower()
    for known in sorted(_gpu_memory_mib(), key=len, reverse=True):
        if known in name:
            return _gpu_memory_mib()[known] * MIB
    return None
