"""Run the project's playbooks through ansible-runner's Python API."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ansible_runner


def project_dir() -> Path:
    """The checkout holding ansible.cfg and playbooks/ (SGLANG_FLEET_PROJECT overrides)."""
    override = os.environ.get("SGLANG_FLEET_PROJECT")
    candidates = [Path(override)] if override else []
    candidates += [Path(__file__).resolve().parents[2], Path.cwd()]
    for path in candidates:
        if (path / "ansible.cfg").is_file() and (path / "playbooks").is_dir():
            return path
    raise FileNotFoundError("cannot find the sglang-fleet project (ansible.cfg, playbooks/); "
                            "run from the checkout or set SGLANG_FLEET_PROJECT")


# Environment variables whose values must not be kept: ansible-runner records the whole
# environment of ansible-playbook in its artifacts (the `command` file).
_SECRET_ENV = re.compile(r"(TOKEN|SECRET|PASSW|API_?KEY|CREDENTIAL|PRIVATE|AUTH|_KEY$|COOKIE)",
                         re.I)
MASK = "********"


def scrub_artifacts(private_data_dir: str) -> None:
    """Mask secret-looking environment values in the runner's `command` records."""
    for path in Path(private_data_dir).glob("artifacts/*/command"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        env = record.get("env") or {}
        masked = {k: (MASK if _SECRET_ENV.search(k) and v else v) for k, v in env.items()}
        if masked != env:
            record["env"] = masked
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record))
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)


@contextmanager
def playbook_run(playbook: str, inventory: str | None = None, limit: str | None = None,
                 extravars: dict[str, Any] | None = None,
                 private_data_dir: str | None = None,
                 cmdline: str | None = None,
                 event_handler: Callable[[dict[str, Any]], bool] | None = None,
                 rotate_artifacts: int = 0,
                 cancel_callback: Callable[[], bool] | None = None,
                 ) -> Iterator[ansible_runner.Runner]:
    """Run a playbook; the runner (events, stats) is readable inside the `with` block.

    Without private_data_dir the artifacts go to a temporary folder removed afterwards; with
    one, they are kept, secret-looking environment values masked.
    """
    project = project_dir()
    # ansible-playbook must be on PATH for runner: use the one beside this interpreter.
    bin_dir = str(Path(sys.executable).parent)
    envvars = {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
               "ANSIBLE_CONFIG": str(project / "ansible.cfg")}
    kwargs: dict[str, Any] = dict(
        project_dir=str(project), playbook=str(project / playbook), quiet=True,
        envvars=envvars, extravars=extravars or {}, limit=limit,
        inventory=str(Path(inventory).resolve()) if inventory else None,
        cmdline=cmdline, event_handler=event_handler, rotate_artifacts=rotate_artifacts,
        # Without a callback, runner installs SIGINT/SIGTERM handlers of its own for good.
        cancel_callback=cancel_callback,
    )
    if private_data_dir:
        os.makedirs(private_data_dir, exist_ok=True)
        try:
            yield ansible_runner.run(private_data_dir=private_data_dir, **kwargs)
        finally:
            scrub_artifacts(private_data_dir)
        return
    with tempfile.TemporaryDirectory(prefix="sglang-fleet-") as tmp:
        yield ansible_runner.run(private_data_dir=tmp, **kwargs)


def task_results(runner: ansible_runner.Runner, task_name: str) -> dict[str, dict[str, Any]]:
    """Module results of one task, by host, from the runner's events."""
    out: dict[str, dict[str, Any]] = {}
    for event in runner.events:
        data = event.get("event_data") or {}
        if data.get("task") == task_name and event.get("event") in (
                "runner_on_ok", "runner_on_failed"):
            out[data["host"]] = dict(data.get("res") or {},
                                     _failed=event["event"] == "runner_on_failed")
    return out


def failures(runner: ansible_runner.Runner) -> list[tuple[str, str, str]]:
    """(host, task, message) of every failed task."""
    out = []
    for event in runner.events:
        if event.get("event") in ("runner_on_failed", "runner_on_unreachable"):
            data = event["event_data"]
            if data.get("ignore_errors"):
                continue
            res = data.get("res") or {}
            out.append((data.get("host", "?"), data.get("task", "?"), str(res.get("msg", res))))
    return out
