"""Reports comparing configurations: rows, a Markdown table and a PNG bar chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sglang_fleet.results import headline_tok_s
from sglang_fleet.runner import project_dir

SIMULATED_NOTE = ("SIMULATED: measured on sglang-sim, whose decode speeds come from its "
                  "profile, not from GPUs.")


def show_value(value: Any, width: int = 48) -> str:
    if isinstance(value, dict):
        text = ", ".join(f"{k}={v}" for k, v in value.items()) or "{}"
    elif isinstance(value, list):
        text = " ".join(map(str, value)) or "[]"
    else:
        text = str(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def change_text(changes: dict[str, Any]) -> str:
    if not changes:
        return "-"
    return "; ".join(f"{k.removeprefix('sglang_server_')}={show_value(v)}"
                     for k, v in changes.items())


def short_path(path: str | None) -> str:
    """A path inside the project folder, relative to it (how the README and tables show it)."""
    if not path:
        return ""
    try:
        return str(Path(path).resolve().relative_to(project_dir()))
    except (ValueError, FileNotFoundError):
        return path


def config_row(name: str, changes: dict[str, Any], verdict: str, entry: dict[str, Any] | None,
               baseline_tok_s: float | None, evidence: str | None = None,
               host: str = "") -> dict[str, Any]:
    """One configuration's figures (None where it was not measured)."""
    level = (entry or {}).get("benchmark", {}).get("levels", [{}])[0] if entry else {}
    tok_s = headline_tok_s(entry) if entry else None
    delta = ((tok_s - baseline_tok_s) / baseline_tok_s * 100.0
             if tok_s is not None and baseline_tok_s else None)
    spread = level.get("output_tok_s") or {}
    return {
        "name": name, "host": host, "changed": change_text(changes), "verdict": verdict,
        "tok_s": tok_s, "tok_s_min": spread.get("min"), "tok_s_max": spread.get("max"),
        "n": spread.get("n"),
        "ttft_s": (level.get("ttft_s") or {}).get("median"),
        "itl_p50_ms": _ms((level.get("itl_s") or {}).get("p50")),
        "itl_p99_ms": _ms((level.get("itl_s") or {}).get("p99")),
        "delta_pct": delta, "evidence": short_path(evidence),
        "config_hash": (entry or {}).get("config_hash", ""),
        "simulated": bool((entry or {}).get("simulated")),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def markdown_table(rows: list[dict[str, Any]], simulated: bool, title: str = "") -> str:
    unit = "tok/s (simulated)" if simulated else "tok/s"
    lines = []
    if title:
        lines += [f"### {title}", ""]
    lines += [
        f"| configuration | changed | verdict | output {unit} | spread | TTFT s | "
        f"ITL p50/p99 ms | vs baseline |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        spread = (f"{r['tok_s_min']:.1f}-{r['tok_s_max']:.1f} (n={r['n']})"
                  if r["tok_s_min"] is not None else "-")
        itl = (f"{r['itl_p50_ms']:.1f}/{r['itl_p99_ms']:.1f}"
               if r["itl_p50_ms"] is not None else "-")
        delta = _num(r["delta_pct"], "+.1f") + ("%" if r["delta_pct"] is not None else "")
        verdict = r["verdict"] + (f" (evidence: `{r['evidence']}`)" if r["evidence"] else "")
        lines.append(f"| {r['name']} | {r['changed']} | {verdict} | {_num(r['tok_s'], '.1f')} "
                     f"| {spread} | {_num(r['ttft_s'], '.3f')} | {itl} | {delta} |")
    if simulated:
        lines += ["", SIMULATED_NOTE]
    return "\n".join(lines) + "\n"


def bar_chart(rows: list[dict[str, Any]], path: Path, title: str, simulated: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    names = [r["name"] for r in rows]
    values = [r["tok_s"] or 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(rows) + 2), 4.2), dpi=110)
    colors = ["#4c72b0" if r["tok_s"] is not None else "#c44e52" for r in rows]
    bars = ax.bar(names, values, color=colors)
    for bar, r in zip(bars, rows, strict=True):
        if r["tok_s"] is None:
            ax.text(bar.get_x() + bar.get_width() / 2, 1, r["verdict"].split(";")[0],
                    ha="center", va="bottom", color="#c44e52", fontsize=9, rotation=90)
            continue
        err_lo, err_hi = r["tok_s"] - r["tok_s_min"], r["tok_s_max"] - r["tok_s"]
        ax.errorbar(bar.get_x() + bar.get_width() / 2, r["tok_s"], yerr=[[err_lo], [err_hi]],
                    color="black", capsize=4, linewidth=1)
        label = f"{r['tok_s']:.1f}"
        if r["delta_pct"] is not None and abs(r["delta_pct"]) >= 0.05:
            label += f"\n({r['delta_pct']:+.1f}%)"
        ax.text(bar.get_x() + bar.get_width() / 2, r["tok_s"], label, ha="center",
                va="bottom", fontsize=9)
    ax.set_ylabel("output tok/s, single stream" + (" (SIMULATED)" if simulated else ""))
    ax.set_title(title + ("\nSIMULATED fleet: speeds from the simulator's profile"
                          if simulated else ""), fontsize=10)
    ax.set_ylim(0, max(values + [1.0]) * 1.25)
    ax.tick_params(axis="x", labelsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(rows: list[dict[str, Any]], folder: Path, stem: str, title: str) -> list[Path]:
    """The Markdown table, the PNG chart and the rows as JSON, in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    simulated = any(r["simulated"] for r in rows)
    md, png, js = folder / f"{stem}.md", folder / f"{stem}.png", folder / f"{stem}.json"
    md.write_text(markdown_table(rows, simulated, title))
    bar_chart(rows, png, title, simulated)
    js.write_text(json.dumps(rows, indent=2, default=str) + "\n")
    return [md, png, js]
