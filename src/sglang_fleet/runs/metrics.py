"""Prometheus text-format metrics of a fleet's verdicts, for node_exporter's textfile
collector (written atomically: the collector never reads half a file)."""

from __future__ import annotations

import os
from pathlib import Path

from sglang_fleet.node.common.vocab import PHASES, VERDICTS
from sglang_fleet.runs.outcomes import HostOutcome


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def is_router(o: HostOutcome) -> bool:
    """A router's outcome carries its own verdict, with its worker counts (health.yml)."""
    return bool((o.verdict or {}).get("router"))


def router_metric_lines(routers: dict[str, HostOutcome]) -> list[str]:
    """Each router's verdict, readiness and workers: clients reach the fleet only through it."""
    lines = ["# HELP sglang_fleet_router_verdict 1 for the router's current verdict, 0 for others.",
             "# TYPE sglang_fleet_router_verdict gauge"]
    for host, o in sorted(routers.items()):
        for verdict in VERDICTS:
            lines.append(f'sglang_fleet_router_verdict{{router="{_label(host)}",'
                         f'verdict="{verdict}"}} {int(o.verdict_name == verdict)}')
    lines += ["# HELP sglang_fleet_router_ready 1 when the router lists a healthy worker and "
              "answered a request through it.",
              "# TYPE sglang_fleet_router_ready gauge"]
    lines += [f'sglang_fleet_router_ready{{router="{_label(h)}"}} '
              f'{int(o.verdict_name == "ready")}' for h, o in sorted(routers.items())]
    lines += ["# HELP sglang_fleet_router_workers The router's workers, as it lists them.",
              "# TYPE sglang_fleet_router_workers gauge"]
    for host, o in sorted(routers.items()):
        counts = (o.verdict or {}).get("router") or {}
        for state in ("registered", "healthy"):
            lines.append(f'sglang_fleet_router_workers{{router="{_label(host)}",'
                         f'state="{state}"}} {int(counts.get(state) or 0)}')
    return lines


def prometheus_text(outcomes: dict[str, HostOutcome], observed_at: float, observations: int,
                    recoveries: dict[str, int]) -> str:
    routers = {h: o for h, o in outcomes.items() if is_router(o)}
    outcomes = {h: o for h, o in outcomes.items() if h not in routers}
    lines = [
        "# HELP sglang_fleet_server_verdict 1 for the server's current verdict, 0 for others.",
        "# TYPE sglang_fleet_server_verdict gauge",
    ]
    for host, o in sorted(outcomes.items()):
        for verdict in VERDICTS:
            lines.append(f'sglang_fleet_server_verdict{{host="{_label(host)}",'
                         f'verdict="{verdict}"}} {int(o.verdict_name == verdict)}')
    lines += ["# HELP sglang_fleet_server_ready 1 when the server is ready.",
              "# TYPE sglang_fleet_server_ready gauge"]
    lines += [f'sglang_fleet_server_ready{{host="{_label(h)}"}} {int(o.verdict_name == "ready")}'
              for h, o in sorted(outcomes.items())]
    lines += ["# HELP sglang_fleet_server_phase 1 for the start-up phase the server is in.",
              "# TYPE sglang_fleet_server_phase gauge"]
    for host, o in sorted(outcomes.items()):
        phase = (o.verdict or {}).get("phase")
        for p in PHASES:
            lines.append(f'sglang_fleet_server_phase{{host="{_label(host)}",phase="{p}"}} '
                         f'{int(phase == p)}')
    lines += ["# HELP sglang_fleet_host_unreachable 1 when the host could not be reached.",
              "# TYPE sglang_fleet_host_unreachable gauge"]
    lines += [f'sglang_fleet_host_unreachable{{host="{_label(h)}"}} '
              f'{int(o.status == "unreachable")}' for h, o in sorted(outcomes.items())]
    lines += ["# HELP sglang_fleet_watch_recoveries_total Recoveries started by this watch.",
              "# TYPE sglang_fleet_watch_recoveries_total counter"]
    lines += [f'sglang_fleet_watch_recoveries_total{{host="{_label(h)}"}} {recoveries.get(h, 0)}'
              for h in sorted(outcomes)]
    lines += ["# HELP sglang_fleet_watch_observations_total Observations of the fleet so far.",
              "# TYPE sglang_fleet_watch_observations_total counter",
              f"sglang_fleet_watch_observations_total {observations}",
              "# HELP sglang_fleet_watch_last_observation_timestamp_seconds When the last "
              "observation ended.",
              "# TYPE sglang_fleet_watch_last_observation_timestamp_seconds gauge",
              f"sglang_fleet_watch_last_observation_timestamp_seconds {observed_at:.3f}"]
    lines += router_metric_lines(routers) if routers else []
    return "\n".join(lines) + "\n"


def write_textfile(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
