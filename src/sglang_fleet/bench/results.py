"""The benchmark results store: entries keyed by LaunchSpec hash, host and time, and the
comparisons made from it (sweep deltas)."""

from __future__ import annotations

from typing import Any

RESULT_KIND = "benchmark"


def hardware_key(spec: dict[str, Any]) -> dict[str, Any]:
    """What makes two measurements comparable: the same GPUs, model and parallelism."""
    return {
        "gpu_model": spec["gpu"]["model"],
        "gpu_count": spec["gpu"]["count"],
        "compute_capability": spec["gpu"]["compute_capability"],
        "interconnect": spec["facts"].get("interconnect"),
        "model": spec["model"]["served_name"],
        "tp": spec["facts"].get("tp"),
        "nnodes": spec["group"]["nnodes"],
        "simulated": spec["install"]["mode"] == "simulator",
    }


def result_entry(spec: dict[str, Any], benchmark: dict[str, Any], label: str = "",
                 run_id: str = "") -> dict[str, Any]:
    """A results-store entry for one measurement of the server `spec` describes."""
    return {
        "kind": RESULT_KIND,
        "host": spec["host"],
        "deployment": spec["deployment"],
        "config_hash": spec["config_hash"],
        "sglang_version": spec["sglang_version"],
        "simulated": spec["install"]["mode"] == "simulator",
        "hardware": hardware_key(spec),
        "settings": spec["settings"],
        "label": label,
        "run_id": run_id,
        "benchmark": benchmark,
    }


def headline_tok_s(entry: dict[str, Any]) -> float | None:
    """Median output tok/s at the first concurrency level (single stream by default)."""
    try:
        return float(entry["benchmark"]["levels"][0]["output_tok_s"]["median"])
    except (KeyError, IndexError, TypeError):
        return None
