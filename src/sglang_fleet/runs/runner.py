"""Run the project's playbooks through ansible-runner's Python API."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ansible_runner
import ansible_runner.runner
import pexpect
from ansible.config.manager import ConfigManager

from sglang_fleet.node.common.secrets import MASK, fingerprint, is_secret_name, mask_secrets
from sglang_fleet.node.process import procs
from sglang_fleet.runs.reasons import ansible_cause

COLLECTION = ("ansible_collections", "sglang", "fleet")
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Loaded before any fork: the child only calls it between fork and exec.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _end_with(parent: int) -> Callable[[], None]:
    """A preexec for ansible-playbook: the kernel sends it SIGTERM when `parent` (the thread
    of this process that forks it, which waits for it) dies, even by SIGKILL or the OOM
    killer. Without it, a run whose CLI was killed was re-parented to PID 1, blocked on its
    output and held the deployment's lock for good. On SIGTERM, ansible-playbook passes the
    signal to its workers (each ends its own session) and ends."""
    def preexec() -> None:
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the CLI died between the fork and the prctl
            os._exit(128 + signal.SIGTERM)
    return preexec


class _PexpectEndingWithTheCli:
    """pexpect as ansible-runner uses it (it spawns ansible-playbook with pexpect.spawn and
    takes no preexec of its own), with every spawn ending with this process (_end_with)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(pexpect, name)

    @staticmethod
    def spawn(*args: Any, **kwargs: Any) -> pexpect.spawn:
        kwargs.setdefault("preexec_fn", _end_with(os.getpid()))
        return pexpect.spawn(*args, **kwargs)


ansible_runner.runner.pexpect = _PexpectEndingWithTheCli()  # type: ignore[assignment]


def _is_collection(path: Path) -> bool:
    return (path / "galaxy.yml").is_file() and (path / "playbooks").is_dir() or \
        (path / "MANIFEST.json").is_file() and (path / "playbooks").is_dir()


def project_dir() -> Path:
    """The operator's Ansible project, whose ansible.cfg the runs use and beside which the
    stores are kept: $SGLANG_FLEET_PROJECT, else the checkout this package runs from, else the
    working folder."""
    override = os.environ.get("SGLANG_FLEET_PROJECT")
    if override:
        return Path(override).resolve()
    checkout = Path(__file__).resolve().parents[3]
    return checkout if _is_collection(checkout) else Path.cwd()


def project_config(project: Path) -> Path | None:
    """The project's ansible.cfg, when it has one (without, Ansible's own search applies)."""
    path = project / "ansible.cfg"
    return path if path.is_file() else None


def collection_dir(project: Path | None = None) -> Path:
    """Where the sglang.fleet playbooks are: the project itself when it is the collection (a
    checkout), else the installed collection, found on the collections path Ansible would use
    with the project's ansible.cfg."""
    project = project or project_dir()
    if _is_collection(project):
        return project
    config = project_config(project)
    paths = ConfigManager(str(config) if config else None).get_config_value("COLLECTIONS_PATHS")
    for root in [*paths, *sys.path]:
        candidate = Path(root).expanduser().joinpath(*COLLECTION)
        if _is_collection(candidate):
            return candidate
    raise FileNotFoundError(
        f"the sglang.fleet collection is not installed where {config or 'Ansible'} looks for "
        "collections; install it (ansible-galaxy collection install sglang-fleet-*.tar.gz) or "
        "set SGLANG_FLEET_PROJECT to a checkout")




def _rewrite_json(path: Path, change: Callable[[Any], Any]) -> None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    masked = change(record)
    if masked != record:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(masked))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)


def _mask_command(record: dict[str, Any]) -> dict[str, Any]:
    env = record.get("env") or {}
    # ansible-runner records the whole environment of ansible-playbook (the `command` file).
    out = dict(record, env={k: (MASK if is_secret_name(k) and v else v)
                            for k, v in env.items()})
    args = []
    for arg in record.get("command") or []:
        if isinstance(arg, str) and arg.startswith("{"):  # -e {json}
            with contextlib.suppress(ValueError):
                arg = json.dumps(mask_secrets(json.loads(arg)))
        args.append(arg)
    if "command" in record:
        out["command"] = args
    return out


# Shorter values are not masked by value: a secret-named variable set to `1` or `yes` would
# blank every such word of every record. Secret settings are refused below 16 characters.
MIN_MASKED_VALUE = 6
_FINGERPRINT = re.compile(r"sha256:[0-9a-f]{12}")


def _secret_values_of_names(value: Any) -> set[str]:
    """The string values under secret names, at any depth."""
    found: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            if is_secret_name(k) and isinstance(v, str | int | float) and not isinstance(
                    v, bool):
                found.add(str(v))
            else:
                found |= _secret_values_of_names(v)
    elif isinstance(value, list):
        for v in value:
            found |= _secret_values_of_names(v)
    return found


def secret_values(root: Path) -> set[str]:
    """Every value that a run's records must not hold, by name and by value: the values of the
    environment variables (of ansible-playbook, as runner recorded it) and of the extra
    variables whose names are secret (the one rule, module_utils/common/secrets.is_secret_name), and
    the value of every environment variable, whatever its name (`SGL_BEARER`, `RKEY`), whose
    fingerprint the run recorded as a secret's (the LaunchSpecs and RouterSpecs record each
    secret they were given as its fingerprint)."""
    recorded: set[str] = set()
    envs: list[dict[str, Any]] = []
    values: set[str] = set()
    for path in root.glob("artifacts/*/command"):
        with contextlib.suppress(OSError, ValueError):
            envs.append(json.loads(path.read_text()).get("env") or {})
    for path in [root / "env" / "extravars", *root.glob("artifacts/*/job_events/*.json")]:
        with contextlib.suppress(OSError, ValueError):
            text = path.read_text()
            recorded.update(_FINGERPRINT.findall(text))
            if path.name == "extravars":
                values |= _secret_values_of_names(json.loads(text))
    for env in envs:
        for name, value in env.items():
            if isinstance(value, str) and (is_secret_name(name) or (
                    recorded and fingerprint(value) in recorded)):
                values.add(value)
    return {v for v in values if len(v) >= MIN_MASKED_VALUE and v != MASK}


def _mask_values(path: Path, values: set[str]) -> None:
    """Every occurrence of each value in the file masked, as written and as JSON escapes it."""
    try:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return
    masked = text
    for value in sorted(values, key=len, reverse=True):
        for form in {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}:
            masked = masked.replace(form, MASK)
    if masked != text:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(masked, encoding="utf-8", errors="surrogateescape")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)


def scrub_artifacts(private_data_dir: str) -> None:
    """Keep the runner's records private and free of secrets: every file 0600 (folders
    0700); secret-named environment values masked in the `command` records; values under
    secret names masked, at any depth, in the extra variables and every job event; then every
    secret value (secret_values) masked by value in every file of the run, whatever name or
    text holds it."""
    root = Path(private_data_dir)
    values = secret_values(root)
    for path in root.glob("artifacts/*/command"):
        _rewrite_json(path, _mask_command)
    for path in [root / "env" / "extravars", *root.glob("artifacts/*/job_events/*.json")]:
        if path.is_file():
            _rewrite_json(path, mask_secrets)
    if values:
        for path in [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]:
            _mask_values(path, values)
    for path in [root, *root.rglob("*")]:
        with contextlib.suppress(OSError):
            os.chmod(path, 0o700 if path.is_dir() else 0o600)


class Interrupted(Exception):
    """The run was interrupted (SIGINT or SIGTERM) and its Ansible processes ended."""

    def __init__(self, signum: int, ended: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.ended = ended  # processes still running in the run's sessions, then killed
        super().__init__(f"interrupted by {self.name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


class InterruptGuard:
    """SIGINT and SIGTERM during a playbook run end the run completely, and nothing else.

    ansible-playbook gets SIGTERM, which it passes on to its workers. Each worker calls
    setsid(), so a signal to ansible-playbook's process group alone misses them (that is what
    ansible-runner's own handler does, and a worker survived it). After a grace period,
    every process still in the session of ansible-playbook or of one of its workers gets
    SIGKILL. The servers the run started live in sessions of their own and keep running.
    """

    def __init__(self, grace_s: float = 10.0):
        self.grace_s = grace_s
        self.signum: int | None = None
        self.playbooks: set[int] = set()  # ansible-playbook: a child of ours, session leader
        self.signalled: set[int] = set()
        self.sessions: set[int] = set()
        self.deadline = 0.0
        self.ended = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> InterruptGuard:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if self.signum is not None:
            self.ended = self._finish()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
            self.deadline = time.monotonic() + self.grace_s
            self._terminate()
        else:  # a second interrupt: no more grace
            self.deadline = 0.0
            self._kill()

    def cancel(self) -> bool:
        """ansible-runner's cancel callback, polled while it reads the run's output. It never
        asks runner to cancel: runner would SIGKILL ansible-playbook's group only."""
        if self.signum is not None:
            self._terminate()
            if time.monotonic() > self.deadline:
                self._kill()
        return False

    def _track(self) -> None:
        me = os.getpid()
        table = {pid: info for pid in procs.all_pids() if (info := procs.process_info(pid))}
        for pid, info in table.items():
            if info["ppid"] == me and info["sid"] == pid:
                self.playbooks.add(pid)
                self.sessions.add(pid)
        for pid, info in table.items():
            if info["ppid"] in self.playbooks and info["sid"] == pid:
                self.sessions.add(pid)  # a worker, in the session it made

    def _terminate(self) -> None:
        self._track()
        for pid in self.playbooks - self.signalled:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
            self.signalled.add(pid)

    def members(self) -> list[int]:
        """Live processes in the run's sessions (this process excluded)."""
        me = os.getpid()
        out = []
        for pid in procs.all_pids():
            info = procs.process_info(pid)
            if info and pid != me and info["sid"] in self.sessions and \
                    info["state"] not in ("Z", "X"):
                out.append(pid)
        return out

    def _kill(self) -> int:
        self._track()
        pids = self.members()
        procs.signal_pids(pids, signal.SIGKILL)
        return len(pids)

    def _finish(self) -> int:
        """After ansible-playbook exited: wait out the grace for what it told to stop, then
        SIGKILL the rest and wait until none is left. Returns how many had to be killed."""
        while self.members() and time.monotonic() < self.deadline:
            time.sleep(0.1)
        killed = self._kill() if self.members() else 0
        end = time.monotonic() + 10
        while self.members() and time.monotonic() < end:
            time.sleep(0.05)
        return killed


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
    one, they are kept, private (0700), secrets masked. Without a cancel_callback, SIGINT and
    SIGTERM end the run and every Ansible process it started (InterruptGuard), and the
    `with` block raises Interrupted once its body has read what the run left.
    """
    project = project_dir()
    config = project_config(project)
    # ansible-playbook must be on PATH for runner: use the one beside this interpreter.
    bin_dir = str(Path(sys.executable).parent)
    envvars = {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    if config:
        envvars["ANSIBLE_CONFIG"] = str(config)
    guard = InterruptGuard() if cancel_callback is None else None
    kwargs: dict[str, Any] = dict(
        project_dir=str(project), playbook=str(collection_dir(project) / playbook), quiet=True,
        envvars=envvars, extravars=extravars or {}, limit=limit,
        inventory=str(Path(inventory).resolve()) if inventory else None,
        cmdline=cmdline, event_handler=event_handler, rotate_artifacts=rotate_artifacts,
        # With a callback, runner installs no SIGINT/SIGTERM handlers of its own.
        cancel_callback=cancel_callback or (guard.cancel if guard else None),
    )
    with guard or contextlib.nullcontext():
        if private_data_dir:
            os.makedirs(private_data_dir, mode=0o700, exist_ok=True)
            os.chmod(private_data_dir, 0o700)
            try:
                yield ansible_runner.run(private_data_dir=private_data_dir, **kwargs)
            finally:
                scrub_artifacts(private_data_dir)
        else:
            with tempfile.TemporaryDirectory(prefix="sglang-fleet-") as tmp:
                yield ansible_runner.run(private_data_dir=tmp, **kwargs)
    if guard and guard.signum is not None:
        raise Interrupted(guard.signum, guard.ended)


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
    """(host, task, message) of every failed task; a template error as its cause."""
    out = []
    for event in runner.events:
        if event.get("event") in ("runner_on_failed", "runner_on_unreachable"):
            data = event["event_data"]
            if data.get("ignore_errors"):
                continue
            res = data.get("res") or {}
            out.append((data.get("host", "?"), data.get("task", "?"),
                        ansible_cause(str(res.get("msg", res)))))
    return out
