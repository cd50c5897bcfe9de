"""The benchmark results store: entries keyed by LaunchSpec hash, host and time, and the
comparisons made from it (the canary's performance gate, sweep deltas)."""

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


def results_for(results: list[dict[str, Any]], config_hash: str,
                hardware: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in results if r.get("kind") == RESULT_KIND
            and r.get("config_hash") == config_hash and r.get("hardware") == hardware
            and headline_tok_s(r) is not None]


def canary_check(previous: dict[str, Any] | None, current: dict[str, Any],
                 max_drop_pct: float) -> dict[str, Any]:
    """Pass unless decode speed fell by more than max_drop_pct against the previous spec."""
    now = headline_tok_s(current)
    label = "simulated " if current.get("simulated") else ""
    if previous is None:
        return {"passed": True, "drop_pct": None, "previous_tok_s": None, "current_tok_s": now,
                "message": f"no stored result for the previous LaunchSpec on this hardware; "
                           f"canary measured {now:.1f} {label}tok/s, nothing to compare"}
    before = headline_tok_s(previous)
    if previous.get("config_hash") == current.get("config_hash"):
        return {"passed": True, "drop_pct": None, "previous_tok_s": before, "current_tok_s": now,
                "message": f"LaunchSpec unchanged ({current.get('config_hash')}); measured "
                           f"{now:.1f} {label}tok/s, stored {before:.1f}"}
    drop = (before - now) / before * 100.0
    passed = drop <= max_drop_pct
    verb = "within" if passed else "beyond"
    return {"passed": passed, "drop_pct": round(drop, 2), "previous_tok_s": before,
            "current_tok_s": now, "previous_config_hash": previous.get("config_hash"),
            "message": f"{before:.1f} -> {now:.1f} {label}tok/s ({-drop:+.1f}%), {verb} the "
                       f"allowed {max_drop_pct:g}% drop (previous config "
                       f"{previous.get('config_hash')}, measured on {previous.get('host')})"}
