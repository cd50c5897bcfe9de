"""Experiments on a live node: sweep and bisect plans, and the trial that both run.

A trial is one real deploy of a configuration through the deploy playbook (ansible-runner),
with its health gate, a benchmark when it comes up ready, and recovery (evidence kept, the
deployment stopped, GPUs verified free, no redeploy) when it does not, so the next trial starts
on a clean node.
"""

from __future__ import annotations

import difflib
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sglang_fleet.launch.spec import PREFIX
from sglang_fleet.runs.outcomes import HostOutcome, host_outcomes
from sglang_fleet.runs.progress import Progress
from sglang_fleet.runs.runner import collection_dir, playbook_run

# Settings that say where a server runs, not how: a trial must not move it.
LOCATION_SETTINGS = tuple(PREFIX + n for n in (
    "root", "python", "port", "host", "deployment_name", "overrides", "allow_rules", "user",
    "service_manager", "install_mode", "group", "node_rank", "dist_init_host"))
BENCH_OPTIONS = ("input_len", "output_len", "warmup", "repetitions", "concurrency")


class PlanError(ValueError):
    """An experiment file that cannot run; str() lists every problem with its fix."""

    def __init__(self, source: str, problems: list[str]):
        self.problems = problems
        super().__init__(f"{source}:\n" + "\n".join(f"  - {p}" for p in problems))


def role_variables() -> set[str]:
    defaults = collection_dir() / "roles" / "sglang_server" / "defaults" / "main.yml"
    return set(yaml.safe_load(defaults.read_text()) or {})


def _check_settings(where: str, settings: Any, known: set[str], problems: list[str]) -> dict:
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        problems.append(f"{where}={settings!r}: must be a mapping of sglang_server_* variables "
                        f"to values. Fix: write it as `{where}: {{sglang_server_tp: 8}}`")
        return {}
    for name in settings:
        if name not in known:
            close = difflib.get_close_matches(str(name), sorted(known), n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]}?)" if close else ""
            problems.append(f"{where}.{name}: not a sglang_server role variable{hint}. Fix: "
                            f"use a variable from roles/sglang_server/defaults/main.yml")
        elif name in LOCATION_SETTINGS:
            problems.append(f"{where}.{name}: says where the server runs, not how it is "
                            f"configured; an experiment must not move it. Fix: set it in the "
                            f"inventory")
    return dict(settings)


def _load_yaml(path: str) -> Any:
    try:
        return yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise PlanError(path, [f"cannot read it: {exc.strerror}"]) from None
    except yaml.YAMLError as exc:
        raise PlanError(path, [f"not valid YAML: {exc}"]) from None


def _allow_rules(where: str, value: Any, problems: list[str]) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        problems.append(f"{where}.allow_rules={value!r}: must be a list of rule ids. Fix: "
                        f"allow_rules: [flashinfer-mla-sm120-graph-capture-hang]")
        return []
    return list(value)


def _bench_options(where: str, value: Any, problems: list[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict) or set(value) - set(BENCH_OPTIONS):
        problems.append(f"{where}={value!r}: takes only {', '.join(BENCH_OPTIONS)}. Fix: e.g. "
                        f"{where}: {{output_len: 256, repetitions: 3}}")
        return {}
    return dict(value)


@dataclass
class Variant:
    name: str
    settings: dict[str, Any]  # what it changes, relative to the baseline
    allow_rules: list[str] = field(default_factory=list)


@dataclass
class SweepPlan:
    baseline: dict[str, Any]
    variants: list[Variant]
    allow_rules: list[str]
    bench: dict[str, Any]
    description: str = ""


def load_sweep(path: str, allow_multiple: bool = False) -> SweepPlan:
    data = _load_yaml(path)
    problems: list[str] = []
    if not isinstance(data, dict):
        raise PlanError(path, ["must be a mapping with baseline and variants"])
    unknown = set(data) - {"description", "baseline", "variants", "allow_rules", "benchmark"}
    if unknown:
        problems.append(f"unknown keys {sorted(unknown)}. Fix: use description, baseline, "
                        f"variants, allow_rules, benchmark")
    known = role_variables()
    baseline = _check_settings("baseline", data.get("baseline"), known, problems)
    variants: list[Variant] = []
    raw = data.get("variants")
    if not isinstance(raw, list) or not raw:
        problems.append("variants: must be a non-empty list. Fix: variants: [{name: x, set: "
                        "{sglang_server_attention_backend: flashinfer}}]")
        raw = []
    names: set[str] = set()
    for i, item in enumerate(raw):
        where = f"variants[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("set"), dict):
            problems.append(f"{where}: needs `set`, a mapping of the variable it changes. Fix: "
                            f"{{name: flashinfer, set: {{sglang_server_attention_backend: "
                            f"flashinfer}}}}")
            continue
        name = str(item.get("name") or ", ".join(f"{k}={v}" for k, v in item["set"].items()))
        if name in names or name == "baseline":
            problems.append(f"{where}.name={name!r}: used twice. Fix: give each variant its "
                            f"own name")
        names.add(name)
        changes = _check_settings(f"{where}.set", item["set"], known, problems)
        same = [k for k, v in changes.items() if k in baseline and baseline[k] == v]
        if same:
            problems.append(f"{where} ({name}): {', '.join(same)} equals the baseline's value, "
                            f"so the variant changes nothing there. Fix: drop it or change it")
        multiple = bool(item.get("multiple")) or allow_multiple
        if len(changes) != 1 and not (multiple and changes):
            problems.append(f"{where} ({name}): changes {len(changes)} variables "
                            f"({', '.join(changes) or 'none'}); a sweep changes one at a time "
                            f"so that a difference has one cause. Fix: split it into one "
                            f"variant per variable, or mark it `multiple: true` (or pass "
                            f"--allow-multiple) if they must change together")
        variants.append(Variant(name, changes, _allow_rules(where, item.get("allow_rules"),
                                                            problems)))
    allow = _allow_rules("sweep", data.get("allow_rules"), problems)
    bench = _bench_options("benchmark", data.get("benchmark"), problems)
    if problems:
        raise PlanError(path, problems)
    return SweepPlan(baseline, variants, allow, bench, str(data.get("description") or ""))


def load_settings(path: str) -> tuple[dict[str, Any], list[str]]:
    """A bisect endpoint: sglang_server_* variables (allow_rules kept apart: it is no change)."""
    data = _load_yaml(path)
    problems: list[str] = []
    if not isinstance(data, dict):
        raise PlanError(path, ["must be a mapping of sglang_server_* variables to values"])
    allow = _allow_rules(path, data.pop(PREFIX + "allow_rules", None), problems)
    settings = _check_settings("settings", data, role_variables(), problems)
    if problems:
        raise PlanError(path, problems)
    return settings, allow


def differing(good: dict[str, Any], bad: dict[str, Any]) -> list[str]:
    """Variables whose values differ, in the bad file's order (then the good file's)."""
    names = list(bad) + [k for k in good if k not in bad]
    return [k for k in names if good.get(k, _MISSING) != bad.get(k, _MISSING)]


_MISSING = object()


@dataclass
class Trial:
    name: str
    settings: dict[str, Any]
    outcome: HostOutcome
    outcomes: dict[str, HostOutcome]
    rc: int
    artifacts: str
    seconds: float

    @property
    def ready(self) -> bool:
        return self.outcome.status == "ok" and self.outcome.verdict_name == "ready"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:60] or "trial"


@dataclass
class TrialRunner:
    """Runs trials on one host (or the nodes of one multi-node group) of an inventory."""

    inventory: str | None
    limit: str
    run_dir: Path
    run_id: str
    bench: dict[str, Any] = field(default_factory=dict)
    extravars: dict[str, Any] = field(default_factory=dict)
    count: int = 0

    def run(self, name: str, settings: dict[str, Any], allow_rules: list[str],
            benchmark: bool = True) -> Trial:
        self.count += 1
        extra: dict[str, Any] = dict(self.extravars)
        extra.update(settings)
        if allow_rules:
            extra[PREFIX + "allow_rules"] = sorted(set(allow_rules))
        extra.update(sglang_recover_on_failure=True, sglang_recover_redeploy=False,
                     sglang_recover_experiment=self.run_id,
                     sglang_fleet_benchmark=benchmark,
                     sglang_bench_label=name, sglang_bench_run_id=self.run_id)
        extra.update({f"sglang_bench_{k}": v for k, v in self.bench.items()})
        return self._deploy(name, settings, extra)

    def restore(self) -> Trial:
        """Deploy the inventory's own configuration again, as before the experiment."""
        self.count += 1
        return self._deploy("restore", {}, dict(self.extravars))

    def _deploy(self, name: str, settings: dict[str, Any], extra: dict[str, Any]) -> Trial:
        artifacts = self.run_dir / f"{self.count:02d}-{_slug(name)}"
        started = time.monotonic()
        # Each trial's stages, phases and a line every 30 s, indented under the trial's own.
        with Progress(indent="    ") as progress, playbook_run(
                "playbooks/deploy.yml", inventory=self.inventory, limit=self.limit, extravars=extra,
                private_data_dir=str(artifacts), event_handler=progress) as run:
            outcomes = host_outcomes(list(run.events), run.stats)
            rc = run.rc
        return Trial(name, settings, _target(outcomes), outcomes, rc, str(artifacts),
                     time.monotonic() - started)


def _target(outcomes: dict[str, HostOutcome]) -> HostOutcome:
    """The trial's verdict: the first failed host, else the one that served (was measured)."""
    for o in outcomes.values():
        if o.status != "ok":
            return o
    for o in outcomes.values():
        if o.benchmark:
            return o
    if outcomes:
        return next(iter(outcomes.values()))
    return HostOutcome("(no host)", status="failed", message="the limit matched no host")
