"""Reports comparing configurations: rows, a Markdown table and a PNG bar chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sglang_fleet.bench.results import headline_tok_s
from sglang_fleet.runs.runner import project_dir

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
               host: str = "", config_hash: str = "") -> dict[str, Any]:
    """One configuration's figures (None where it was not measured); `config_hash` names
    a configuration that has no measurement."""
    level = (entry or {}).get("benchmark", {}).get("levels", [{}])[0] if entry else {}
    tok_s = headline_tok_s(entry) if entry else None
    delta = ((tok_s - baseline_tok_s) / baseline_tok_s * 100.0
             if tok_s is not None and baseline_tok_s else None)
    spread = level.get("output_tok_s") or {}
    bench = (entry or {}).get("benchmark") or {}
    return {
        "name": name, "host": host, "changed": change_text(changes), "verdict": verdict,
        "tok_s": tok_s, "tok_s_min": spread.get("min"), "tok_s_max": spread.get("max"),
        "n": spread.get("n"),
        "ttft_s": (level.get("ttft_s") or {}).get("median"),
        "itl_p50_ms": _ms((level.get("itl_s") or {}).get("p50")),
        "itl_p99_ms": _ms((level.get("itl_s") or {}).get("p99")),
        "delta_pct": delta, "evidence": short_path(evidence),
        "config_hash": (entry or {}).get("config_hash") or config_hash,
        "simulated": bool((entry or {}).get("simulated")),
        "hardware": hardware_text((entry or {}).get("hardware")),
        "load": load_text(bench, level),
    }


def hardware_text(hardware: dict[str, Any] | None) -> str:
    """'Kimi-K2.5 TP=8 on 8x RTX PRO 6000 Blackwell': what was served, on what."""
    if not hardware:
        return ""
    nodes = f" x {hardware['nnodes']} nodes" if (hardware.get("nnodes") or 1) > 1 else ""
    return (f"{hardware.get('model')} TP={hardware.get('tp')} on {hardware.get('gpu_count')}x "
            f"{hardware.get('gpu_model')}{nodes}")


def load_text(bench: dict[str, Any], level: dict[str, Any]) -> str:
    """'concurrency 1, 1024 tokens in, 256 out': how it was measured."""
    if not bench:
        return ""
    return (f"concurrency {level.get('concurrency', 1)}, {bench.get('input_len')} tokens in, "
            f"{bench.get('output_len')} out")


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


def _common(rows: list[dict[str, Any]], key: str) -> str:
    """The value every measured row shares, else ''."""
    values = {r[key] for r in rows if r["tok_s"] is not None and r[key]}
    return values.pop() if len(values) == 1 else ""


def chart_title(rows: list[dict[str, Any]], title: str, subject: str) -> str:
    """What was measured, where and how: the chart's title block."""
    lines = [title]
    hardware = _common(rows, "hardware")
    if hardware and hardware.split(" ")[0] in title:
        hardware = ""  # the title already names the model
    what = ", ".join(x for x in (hardware, subject) if x)
    if what:
        lines.append(what)
    n = {r["n"] for r in rows if r["tok_s"] is not None}
    runs = f"median of {n.pop()} runs" if len(n) == 1 else "median of the runs"
    load = _common(rows, "load")
    lines.append(f"output tok/s ({load}), {runs}" if load else f"output tok/s, {runs}")
    return "\n".join(lines)


def bar_chart(rows: list[dict[str, Any]], path: Path, title: str, simulated: bool,
              subject: str = "") -> None:
    import matplotlib.pyplot as plt

    fig = draw_chart(rows, title, simulated, subject)
    fig.savefig(path)
    plt.close(fig)


def draw_chart(rows: list[dict[str, Any]], title: str, simulated: bool, subject: str = ""):
    """Bars of median output tok/s per configuration, whiskers from the slowest to the
    fastest run, each value written above its whisker; a configuration that was not
    measured gets its verdict in its slot instead of a bar. Returns the matplotlib figure."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    measured = [r for r in rows if r["tok_s"] is not None]
    top = max([r["tok_s_max"] or r["tok_s"] for r in measured] + [1.0]) * 1.3
    fig, ax = plt.subplots(figsize=(max(6.4, 2.0 * len(rows) + 2.4), 5.0), dpi=110)
    positions = list(range(len(rows)))
    pad = top * 0.015
    for x, r in zip(positions, rows, strict=True):
        if r["tok_s"] is None:
            # No bar: the slot says why, level and readable, in the failure colour.
            ax.bar(x, top, width=0.8, color="#fdf3f3", edgecolor="#e3a5a7", hatch="//",
                   linewidth=0.6, zorder=1)
            verdict = textwrap.fill(r["verdict"].split(";")[0], 22, break_long_words=False,
                                    break_on_hyphens=False)
            ax.text(x, top * 0.5, verdict + "\nnot measured", ha="center", va="center",
                    color="#8c1c22", fontsize=9, zorder=3,
                    bbox={"facecolor": "white", "edgecolor": "#e3a5a7", "alpha": 0.95})
            continue
        ax.bar(x, r["tok_s"], width=0.8, color="#4c72b0", zorder=2)
        low, high = r["tok_s_min"], r["tok_s_max"]
        if low is not None and high is not None:
            ax.errorbar(x, r["tok_s"], yerr=[[r["tok_s"] - low], [high - r["tok_s"]]],
                        color="black", capsize=6, linewidth=1.2, zorder=3)
        label = f"{r['tok_s']:.1f}"
        if low is not None and high is not None and r["n"] and r["n"] > 1:
            label += f" ({low:.1f}-{high:.1f})"
        if r["delta_pct"] is not None and abs(r["delta_pct"]) >= 0.05:
            label += f"\n{r['delta_pct']:+.1f}% vs baseline"
        # Above the whisker's cap, never on it.
        ax.text(x, max(high or r["tok_s"], r["tok_s"]) + pad, label, ha="center",
                va="bottom", fontsize=9, zorder=4)
    one_host = len({r["host"] for r in rows}) == 1
    labels = []
    for r in rows:
        where = [r["host"]] if r["host"] and r["host"] != r["name"] and not one_host else []
        where += [f"config {r['config_hash']}"] if r["config_hash"] else []
        labels.append(r["name"] + ("\n" + ", ".join(where) if where else ""))
    ax.set_xticks(positions, labels, fontsize=9)
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_ylim(0, top)
    ax.set_ylabel("output tok/s" + (" (SIMULATED)" if simulated else ""))
    ax.grid(axis="y", color="#dddddd", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    heading = chart_title(rows, title, subject)
    if simulated:
        heading += "\nSIMULATED: speeds from sglang-sim's profile, not from GPUs"
    ax.set_title(heading, fontsize=10)
    fig.text(0.01, 0.01, "bar: median; whisker and (range): slowest to fastest run", fontsize=8,
             color="#555555", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def write_report(rows: list[dict[str, Any]], folder: Path, stem: str, title: str,
                 subject: str = "") -> list[Path]:
    """The Markdown table, the PNG chart and the rows as JSON, in `folder`; `subject` says
    what ran (e.g. 'sweep incident-sweep.yml on sim-node-1') for the chart's title."""
    folder.mkdir(parents=True, exist_ok=True)
    simulated = any(r["simulated"] for r in rows)
    md, png, js = folder / f"{stem}.md", folder / f"{stem}.png", folder / f"{stem}.json"
    md.write_text(markdown_table(rows, simulated, title))
    bar_chart(rows, png, title, simulated, subject)
    js.write_text(json.dumps(rows, indent=2, default=str) + "\n")
    return [md, png, js]
