"""What happened to each host in one playbook run, read from ansible-runner's events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_OK = ("runner_on_ok", "runner_on_failed")
_SET_FACT = ("set_fact", "ansible.builtin.set_fact")
_RAN = ("runner_on_ok", "runner_on_failed", "runner_on_unreachable")
# Stages a host goes through, named after the role task files that implement them.
STAGES = ("spec", "deploy", "health", "benchmark", "recover")
# Every task file of the server role has one (a unit test holds it to that): a failure in a file
# left out would be missing from the host's stages.
_STAGE_OF_FILE = {"main.yml": "spec", "spec.yml": "spec", "identity.yml": "spec",
                  "spec_fallback.yml": "spec",
                  "deploy.yml": "deploy", "install.yml": "deploy", "preflight.yml": "deploy",
                  "converge.yml": "deploy",
                  "change.yml": "deploy", "prepare.yml": "deploy", "argcheck.yml": "deploy",
                  "lock.yml": "deploy", "configure.yml": "deploy", "service.yml": "deploy",
                  "gate.yml": "health", "observe.yml": "health", "report.yml": "health",
                  "ready.yml": "health",
                  "soak.yml": "health", "verdict.yml": "health"}
# The router role: refused settings fail at "spec" (exit 2, like a server's); the router's view
# beside a verdict, and its own verdict, are "health"; install, service, membership and drain
# steps are "deploy".
_ROUTER_STAGE_OF_FILE = {"spec.yml": "spec", "view.yml": "health", "health.yml": "health"}


def gate_result(action: str, res: dict[str, Any]) -> dict[str, Any] | None:
    """The gate's result a task event carries: an sglang_health observation's, the one the
    node check (sglang_node) took when nothing was to change, or a router's own verdict (its
    report's visit: sglang_router_probe, or its check's, sglang_router_node); None for any
    other event."""
    found = res if action == "sglang_health" else (res.get("gate") or {}) \
        if action in ("sglang_node", "sglang_router_node", "sglang_router_probe") else {}
    return found if found.get("verdict") else None


def _verdict(res: dict[str, Any]) -> dict[str, Any]:
    return {k: res.get(k) for k in ("verdict", "phase", "reason", "progress_text", "headline",
                                    "evidence", "cause", "failure", "advice", "stopped_by",
                                    "stopped_at", "router")}


def stage_of(data: dict[str, Any]) -> str | None:
    """The stage of a task event, from the role and task file it came from."""
    path = str(data.get("task_path") or "")
    if str(data.get("task_action")).endswith("validate_argument_spec"):
        return "spec"  # the role's argument_specs: the inventory's types
    if "/playbooks/validate.yml" in path:
        return "spec"  # the inventory's own check, before any node is touched
    if "/playbooks/health.yml" in path and "include" not in str(data.get("task_action")):
        return "health"  # its verdict per host: a server that is not ready fails there
    if "/roles/sglang_recover/" in path:
        return "recover"
    if "/roles/sglang_bench/" in path:
        return "benchmark"
    if "/roles/sglang_server/" in path:
        return _STAGE_OF_FILE.get(path.rsplit("/", 1)[-1].split(":")[0])
    if "/roles/sglang_router/" in path:
        return _ROUTER_STAGE_OF_FILE.get(path.rsplit("/", 1)[-1].split(":")[0], "deploy")
    return None


# A host's status at the end of a run. A host is `ok` only when the run reached its recap with
# no failure for it; a run that ended before (killed, or an internal error) leaves it
# `not observed`, an interrupted one `interrupted`.
OK, FAILED, UNREACHABLE = "ok", "failed", "unreachable"
INTERRUPTED, NOT_OBSERVED = "interrupted", "not observed"
# A host whose own configuration passed, held back because another host's was refused.
NOT_STARTED = "not started"
# playbooks/validate.yml's last task: it fails when any host's configuration was refused.
REFUSED_RUN_TASK = "Stop the run when any host was refused, before any node is touched"


@dataclass
class HostOutcome:
    host: str
    status: str = OK  # OK, FAILED, UNREACHABLE, INTERRUPTED, NOT_OBSERVED
    verdict: dict[str, Any] | None = None  # the last health observation
    message: str = ""  # the last failure's message
    failed_task: str = ""
    benchmark: dict[str, Any] | None = None  # results-store entry
    recovery: dict[str, Any] | None = None  # ledger entry
    canary: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    # stage -> None when it ran and passed, else the failure message (rescued or not)
    stages: dict[str, str | None] = field(default_factory=dict)
    last_stage: str | None = None  # where the host was last seen: stage and task
    last_task: str = ""

    @property
    def verdict_name(self) -> str:
        if self.status == "unreachable":
            return "unreachable"
        if self.verdict:
            return str(self.verdict.get("verdict"))
        if self.status == NOT_STARTED:
            return NOT_STARTED
        return "failed" if self.status == FAILED else NOT_OBSERVED

    @property
    def only_checked(self) -> bool:
        """It went no further than the controller's checks: no node of it was touched."""
        return set(self.stages) <= {"spec"}

    @property
    def evidence(self) -> str | None:
        return (self.recovery or {}).get("evidence")


def failure_message(res: dict[str, Any]) -> str:
    """A failure's message; a loop's (a router's membership, one item per router) is its
    failed items' own, not Ansible's "One or more items failed"."""
    items = res.get("results") if isinstance(res.get("results"), list) else []
    said = [str(r["msg"]).strip() for r in items
            if isinstance(r, dict) and r.get("failed") and r.get("msg")]
    if said:
        return "; ".join(dict.fromkeys(said))
    msg = res.get("msg")
    if msg is None:
        msg = res.get("stderr") or res.get("module_stderr") or ""
    return str(msg).strip()


def _read_result(o: HostOutcome, kind: str, action: str, res: dict[str, Any]) -> None:
    """What one task's result records of a host: its verdict, benchmark, canary, recovery,
    notes."""
    gate = gate_result(action, res)
    if gate and kind == "runner_retry":
        # A gate poll still waiting: the host's last known verdict if the run ends here.
        o.verdict = _verdict(gate)
    if kind not in _OK:
        return
    if gate:
        o.verdict = _verdict(gate)
    elif action in _SET_FACT:
        facts = res.get("ansible_facts") or {}
        judged = facts.get("sglang_server_verdict")
        if isinstance(judged, dict) and judged.get("verdict"):
            o.verdict = _verdict(judged)  # judged again on the controller (a PD prefill's)
        if "sglang_bench_result" in facts:
            o.benchmark = facts["sglang_bench_result"]
        if "sglang_bench_canary" in facts:
            o.canary = facts["sglang_bench_canary"]
    elif action == "sglang_ledger" and \
            (res.get("entry") or {}).get("kind") == "recovery":
        o.recovery = res["entry"]
    elif action in ("debug", "ansible.builtin.debug") and isinstance(res.get("msg"), str):
        o.notes.append(res["msg"])


def _hold_back(out: dict[str, HostOutcome], why: str) -> None:
    """A run refused before any node was touched: the hosts whose own configuration passed
    were never started."""
    for o in out.values():
        if not o.stages.get("spec") and o.status in (OK, FAILED):
            o.status, o.message = NOT_STARTED, why


def _left_behind(out: dict[str, HostOutcome]) -> None:
    """A rollout stopped by a failure: the hosts it never reached (checked, never deployed or
    observed) keep what they were running."""
    for o in out.values():
        if o.status == OK and not o.verdict and o.only_checked:
            o.status = NOT_STARTED
            o.message = "not reached: the rollout stopped at a failed host; it runs as before"


def host_outcomes(events: list[dict[str, Any]], stats: dict[str, Any] | None,
                  interrupted: bool = False) -> dict[str, HostOutcome]:
    """Each host's outcome. `stats` is the run's recap (None when the run ended without
    one); a host missing from it is `interrupted` or `not observed`, never `ok`."""
    out: dict[str, HostOutcome] = {}
    refused_run: list[str] = []

    def get(host: str) -> HostOutcome:
        return out.setdefault(host, HostOutcome(host))

    for event in events:
        kind = event.get("event")
        data = event.get("event_data") or {}
        host = data.get("host")
        if not host:
            continue
        if data.get("task") == REFUSED_RUN_TASK and kind == "runner_on_failed":
            refused_run.append(failure_message(data.get("res") or {}))
            continue
        res = data.get("res") or {}
        # Modules by their short names: the playbooks call them as sglang.fleet.<module>.
        action = (data.get("task_action") or "").rpartition(".")[2]
        stage = stage_of(data)
        if kind in _RAN or kind in ("runner_on_start", "runner_retry"):
            o = get(host)
            o.last_stage, o.last_task = stage or o.last_stage, data.get("task") or o.last_task
        if stage and kind in _RAN:
            stages = get(host).stages
            if kind != "runner_on_ok" and not data.get("ignore_errors"):
                stages[stage] = failure_message(res) or data.get("task", "failed")
            else:
                stages.setdefault(stage, None)
        if kind == "runner_on_unreachable":
            o = get(host)
            o.status, o.message = "unreachable", failure_message(res)
            o.failed_task = data.get("task", "")
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            o = get(host)
            o.message, o.failed_task = failure_message(res), data.get("task", "")
        _read_result(get(host), kind, action, res)
    _apply_recap(out, stats or {}, interrupted, refused_run[0] if refused_run else None)
    return out


def _apply_recap(out: dict[str, HostOutcome], stats: dict[str, Any], interrupted: bool,
                 refused: str | None) -> None:
    """Statuses from the run's recap. A run refused before any node was touched (`refused`,
    the validation's message) counts only the refused hosts as failed."""
    for key, status in (("failures", FAILED), ("dark", UNREACHABLE)):
        for host in stats.get(key) or {}:
            o = out.setdefault(host, HostOutcome(host))
            if status == UNREACHABLE or any(o.stages.values()) or not refused:
                o.status = status
    if refused:
        _hold_back(out, refused)
    elif any(o.status in (FAILED, UNREACHABLE) for o in out.values()):
        _left_behind(out)
    for host in stats.get("ok") or {}:
        out.setdefault(host, HostOutcome(host))
    recapped = {h for value in stats.values() if isinstance(value, dict) for h in value}
    for host, o in out.items():
        if o.status == OK and host not in recapped:
            o.status = INTERRUPTED if interrupted else NOT_OBSERVED
