"""What happened to each host in one playbook run, read from ansible-runner's events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_OK = ("runner_on_ok", "runner_on_failed")
_SET_FACT = ("set_fact", "ansible.builtin.set_fact")
_RAN = ("runner_on_ok", "runner_on_failed", "runner_on_unreachable")
# Stages a host goes through, named after the role task files that implement them.
STAGES = ("spec", "deploy", "health", "benchmark", "recover")
_STAGE_OF_FILE = {"spec.yml": "spec", "install.yml": "deploy", "preflight.yml": "deploy",
                  "argcheck.yml": "deploy", "configure.yml": "deploy", "service.yml": "deploy",
                  "gate.yml": "health", "observe.yml": "health"}
# The router role: refused settings fail at "spec" (exit 2, like a server's); the router's view
# beside a verdict is "health"; install, service, membership and drain steps are "deploy".
_ROUTER_STAGE_OF_FILE = {"spec.yml": "spec", "view.yml": "health"}


def stage_of(data: dict[str, Any]) -> str | None:
    """The stage of a task event, from the role and task file it came from."""
    path = str(data.get("task_path") or "")
    if str(data.get("task_action")).endswith("validate_argument_spec"):
        return "spec"  # the role's argument_specs: the inventory's types
    if "/roles/sglang_recover/" in path:
        return "recover"
    if "/roles/sglang_bench/" in path:
        return "benchmark"
    if "/roles/sglang_server/" in path:
        return _STAGE_OF_FILE.get(path.rsplit("/", 1)[-1].split(":")[0])
    if "/roles/sglang_router/" in path:
        return _ROUTER_STAGE_OF_FILE.get(path.rsplit("/", 1)[-1].split(":")[0], "deploy")
    return None


@dataclass
class HostOutcome:
    host: str
    status: str = "ok"  # ok, failed, unreachable
    verdict: dict[str, Any] | None = None  # the last health observation
    message: str = ""  # the last failure's message
    failed_task: str = ""
    benchmark: dict[str, Any] | None = None  # results-store entry
    recovery: dict[str, Any] | None = None  # ledger entry
    canary: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    # stage -> None when it ran and passed, else the failure message (rescued or not)
    stages: dict[str, str | None] = field(default_factory=dict)

    @property
    def verdict_name(self) -> str:
        if self.status == "unreachable":
            return "unreachable"
        if self.verdict:
            return str(self.verdict.get("verdict"))
        return "failed" if self.status == "failed" else "not observed"

    @property
    def evidence(self) -> str | None:
        return (self.recovery or {}).get("evidence")


def _message(res: dict[str, Any]) -> str:
    msg = res.get("msg")
    if msg is None:
        msg = res.get("stderr") or res.get("module_stderr") or ""
    return str(msg).strip()


def host_outcomes(events: list[dict[str, Any]],
                  stats: dict[str, Any] | None) -> dict[str, HostOutcome]:
    out: dict[str, HostOutcome] = {}

    def get(host: str) -> HostOutcome:
        return out.setdefault(host, HostOutcome(host))

    for event in events:
        kind = event.get("event")
        data = event.get("event_data") or {}
        host = data.get("host")
        if not host:
            continue
        res = data.get("res") or {}
        action = data.get("task_action") or ""
        stage = stage_of(data)
        if stage and kind in _RAN:
            stages = get(host).stages
            if kind != "runner_on_ok" and not data.get("ignore_errors"):
                stages[stage] = _message(res) or data.get("task", "failed")
            else:
                stages.setdefault(stage, None)
        if kind == "runner_on_unreachable":
            o = get(host)
            o.status, o.message, o.failed_task = "unreachable", _message(res), data.get("task", "")
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            o = get(host)
            o.message, o.failed_task = _message(res), data.get("task", "")
        if kind not in _OK:
            continue
        if action == "sglang_health" and "verdict" in res:
            get(host).verdict = {k: res.get(k) for k in
                                 ("verdict", "phase", "reason", "progress_text", "evidence")}
        elif action in _SET_FACT:
            facts = res.get("ansible_facts") or {}
            if "sglang_bench_result" in facts:
                get(host).benchmark = facts["sglang_bench_result"]
            if "sglang_bench_canary" in facts:
                get(host).canary = facts["sglang_bench_canary"]
        elif action == "sglang_ledger" and (res.get("entry") or {}).get("kind") == "recovery":
            get(host).recovery = res["entry"]
        elif action in ("debug", "ansible.builtin.debug") and isinstance(res.get("msg"), str):
            get(host).notes.append(res["msg"])
    for key, status in (("failures", "failed"), ("dark", "unreachable")):
        for host in (stats or {}).get(key) or {}:
            get(host).status = status
    for host in (stats or {}).get("ok") or {}:
        get(host)
    return out
