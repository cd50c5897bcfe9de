"""Node-side process membership, the supervisor and the systemd driver."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from sglang_fleet.node.process import procs
from sglang_fleet.node.process.service import Supervisor, Systemd, files_digest
from sglang_fleet.testfleet.local import wait_for

SLEEPER = "import time\nwhile True: time.sleep(1)\n"


@pytest.fixture
def marker():
    value = f"test:{uuid.uuid4().hex[:8]}"
    yield value
    procs.stop_deployment(value, term_timeout=2)


def spawn(marker, code=SLEEPER, **kwargs):
    env = dict(os.environ, **{procs.MARKER_VAR: marker})
    return subprocess.Popen([sys.executable, "-c", code], env=env, **kwargs)


def test_membership_finds_marked_processes_and_orphans_only(marker, tmp_path):
    bystander = subprocess.Popen([sys.executable, "-c", SLEEPER])
    other = spawn(marker + "-other")
    # A parent that starts a marked grandchild and exits: the grandchild is an orphan.
    pidfile = tmp_path / "orphan.pid"
    parent = spawn(marker, code=(
        "import subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"))
    parent.wait()
    orphan = int(wait_for(lambda: pidfile.exists() and pidfile.read_text()))
    try:
        found = {p["pid"] for p in procs.deployment_processes(marker)}
        assert found == {orphan}
        report = procs.stop_deployment(marker, term_timeout=5)
        assert report["term_sent"] == [orphan] and report["remaining"] == []
        assert bystander.poll() is None and other.poll() is None
    finally:
        bystander.kill()
        other.kill()
        bystander.wait()
        other.wait()


def test_stop_escalates_to_kill_for_a_process_ignoring_term(marker):
    stubborn = spawn(marker, code="import signal, time\nsignal.signal(signal.SIGTERM, "
                     "signal.SIG_IGN)\nprint('ready', flush=True)\nwhile True: time.sleep(1)\n",
                     stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline().strip() == "ready"
    report = procs.stop_deployment(marker, term_timeout=0.5)
    assert report["kill_sent"] == [stubborn.pid] and report["remaining"] == []
    assert stubborn.wait(5) == -9


def test_module_never_targets_its_own_lineage(marker):
    os.environ[procs.MARKER_VAR] = marker
    try:
        assert os.getpid() not in {p["pid"] for p in procs.deployment_processes(marker)}
    finally:
        del os.environ[procs.MARKER_VAR]


def test_supervisor_detaches_keeps_log_and_records_identity_and_config(marker, tmp_path):
    script = tmp_path / "launch.sh"
    script.write_text(f"#!/bin/bash\necho started-$$\nexec {sys.executable} -c 'import time\n"
                      "while True: time.sleep(1)'\n")
    script.chmod(0o755)
    log, state = tmp_path / "logs" / "s.log", tmp_path / "run" / "s.pid"
    running_spec = tmp_path / "run" / "s.running-spec.json"
    sup = Supervisor(marker, str(script), str(log), str(state), str(tmp_path))
    spec = {"config_hash": "0123456789ab", "marker": marker, "argv": ["x"]}
    pid = sup.start("digest-1", "0123456789ab", spec, str(running_spec))
    status = wait_for(lambda: sup.status()["running"] and sup.status())
    assert status["pid"] == pid and status["digest"] == "digest-1"
    assert status["config_hash"] == "0123456789ab"
    assert os.getsid(pid) == pid  # its own session: ansible's process group cannot take it down
    record = json.loads(state.read_text())
    assert record["pid_start"] == procs.process_info(pid)["start_ticks"]
    assert record["boot_id"] == procs.boot_id() and record["config_hash"] == "0123456789ab"
    assert json.loads(running_spec.read_text()) == spec
    assert running_spec.stat().st_mode & 0o777 == 0o600
    wait_for(lambda: "started-" in log.read_text())
    assert sup.stop(5)["remaining"] == []
    sup.start("digest-2", "ba9876543210")
    wait_for(lambda: log.read_text().count("started-") == 2)
    text = log.read_text()
    # Both runs' output is kept (the launch script opens each run with its own separator).
    assert text.count("started-") == 2
    sup.stop(5)
    assert json.loads(state.read_text())["pid"] is None


def test_supervisor_records_the_exit_status(marker, tmp_path):
    script = tmp_path / "launch.sh"
    script.write_text("#!/bin/bash\necho failing\nexit 3\n")
    script.chmod(0o755)
    state = tmp_path / "s.pid"
    sup = Supervisor(marker, str(script), str(tmp_path / "s.log"), str(state), str(tmp_path))
    sup.start("d")
    exit_file = tmp_path / "s.pid.exit"
    assert wait_for(lambda: exit_file.exists() and exit_file.read_text().strip()) == "3"
    assert not sup.status()["running"]


def test_systemd_driver_command_sequence(marker, tmp_path):
    calls = []

    loaded = {"state": "not-found"}

    def fake(args):
        calls.append(args[1:])
        if args[1] == "show":
            return 0, (f"ActiveState=active\nMainPID=4242\nLoadState={loaded['state']}\n"
                       "NeedDaemonReload=no\nUnitFileState=disabled\n"), ""
        if args[1] == "daemon-reload":
            loaded["state"] = "loaded"
        return 0, "", ""

    unit = Systemd(marker, "sglang-x.service", str(tmp_path / "x.state"), run=fake)
    unit.start("d1")
    actions = [c for c in calls if c[0] != "show"]
    assert actions == [["daemon-reload"], ["enable", "sglang-x.service"],
                       ["restart", "sglang-x.service"]]
    assert unit.status()["digest"] == "d1" and unit.status()["pid"] == 4242
    # A loaded unit whose file did not change: no reload, just the restart.
    calls.clear()
    unit.start("d2")
    assert ["daemon-reload"] not in calls and ["restart", "sglang-x.service"] in calls
    unit.stop(5)
    assert ["stop", "sglang-x.service"] in calls


def test_systemd_failure_names_the_command(marker, tmp_path):
    from sglang_fleet.node.process.service import ServiceError
    unit = Systemd(marker, "u.service", str(tmp_path / "s"),
                   run=lambda a: (1, "", "Unit u.service not found.") if a[1] == "restart"
                   else (0, "", ""))
    with pytest.raises(ServiceError, match="systemctl restart u.service failed.*not found"):
        unit.start("d")


def test_files_digest_changes_with_content(tmp_path):
    f = tmp_path / "a"
    f.write_text("1")
    one = files_digest([str(f)])
    f.write_text("2")
    assert files_digest([str(f)]) != one
    assert files_digest([str(tmp_path / "missing")])


def test_session_membership_finds_workers_whose_title_erased_the_marker(marker, tmp_path):
    # setproctitle without SPT_NOENV overwrites /proc/PID/environ: the supervisor's session
    # (its leader, a shell that keeps the marker) still ties the renamed worker to its
    # deployment.
    code = ("import os, time, setproctitle\n"
            "setproctitle.setproctitle('sglang::scheduler_TP0')\n"
            "print('ready', flush=True)\nwhile True: time.sleep(1)\n")
    env = {k: v for k, v in os.environ.items() if k != "SPT_NOENV"}
    env[procs.MARKER_VAR] = marker
    leader = subprocess.Popen(["/bin/sh", "-c", '"$0" -c "$1"', sys.executable, code], env=env,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert leader.stdout.readline().strip() == "ready"
        worker = wait_for(lambda: [p for p in procs.deployment_processes(
            marker, session_id=leader.pid) if p["pid"] != leader.pid])
        assert [p["cmdline"] for p in worker] == ["sglang::scheduler_TP0"]
        assert worker[0]["member_by"] == "session" and not worker[0]["carries_marker"]
        assert worker[0]["pid"] not in {p["pid"] for p in procs.deployment_processes(marker)}
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()


def test_a_recorded_session_id_now_held_by_an_unrelated_session_is_not_trusted(marker):
    """A stale state file names a PID that an unrelated session now leads: its processes are
    not members, by the marker check (the leader does not carry it) and by the start-time
    check (the leader started later than recorded)."""
    unrelated = subprocess.Popen(["/bin/sh", "-c", "sleep 600 & wait"], start_new_session=True)
    try:
        child = wait_for(lambda: [p for p in procs.all_pids()
                                  if (procs.process_info(p) or {}).get("sid") == unrelated.pid
                                  and p != unrelated.pid])
        stale = {"pid": unrelated.pid, "pid_start": procs.process_info(unrelated.pid)[
            "start_ticks"] - 100, "boot_id": procs.boot_id()}
        assert not procs.trusted_session(unrelated.pid, marker)
        assert procs.deployment_processes(marker, **procs.recorded_session(stale)) == []
        assert not procs.recorded_main_alive(stale, [])
        report = procs.stop_deployment(marker, 1, **procs.recorded_session(stale))
        assert report["term_sent"] == [] and report["kill_sent"] == []
        assert unrelated.poll() is None and procs.process_info(child[0])
        # Even a leader that happens to carry the marker is refused on its start time.
        assert not procs.same_process({"pid": unrelated.pid, "start_ticks": stale["pid_start"],
                                       "boot_id": procs.boot_id()})
    finally:
        os.killpg(unrelated.pid, 9)
        unrelated.wait()


def test_another_users_process_with_the_marker_is_reported_and_never_signalled(marker):
    env = dict(os.environ, **{procs.MARKER_VAR: marker})
    other = subprocess.Popen(["/bin/sleep", "600"], env=env, user=65534, group=65534)
    mine = spawn(marker)
    try:
        wait_for(lambda: procs.process_info(other.pid)
                 and procs.process_info(other.pid)["uid"] == 65534)
        found = procs.membership(marker, uid=0)
        assert {p["pid"] for p in found["members"]} == {mine.pid}
        assert [p["pid"] for p in found["foreign"]] == [other.pid]
        assert "does not run as the service user root: not signalled" in \
            procs.describe_foreign(found["foreign"], "root")[0]
        report = procs.stop_deployment(marker, 5, uid=0)
        assert report["term_sent"] == [mine.pid] and other.poll() is None
        assert [p["pid"] for p in report["foreign"]] == [other.pid]
    finally:
        other.kill()
        mine.kill()
        other.wait()
        mine.wait()


SGLANG_RANK1 = (
    "import signal, sys, time\n"
    "def on_term(*_):\n"
    "    if sys.argv[1] == 'log':\n"
    "        print('[2026-11-30 10:00:00] SIGTERM received on node_rank 1; waiting for the '\n"
    "              'rank-0 ShutdownReq broadcast to stop the schedulers.', flush=True)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "print('ready', flush=True)\n"
    "while True: time.sleep(0.1)\n")


@pytest.mark.parametrize("logs", [True, False])
def test_a_non_zero_rank_that_only_logs_sigterm_is_killed_without_waiting_out_the_timeout(
        marker, tmp_path, logs, monkeypatch):
    """Real SGLang's non-zero node ranks log SIGTERM and keep running (engine.py, 0.5.23):
    SIGKILL follows as soon as the log says so, or after a short grace, not after 60 s."""
    monkeypatch.setattr(procs, "NONZERO_RANK_TERM_GRACE", 2.0)  # the rule, not its length
    log = tmp_path / "rank1.log"
    env = dict(os.environ, **{procs.MARKER_VAR: marker})
    with open(log, "wb") as out:
        # "log": print SGLang's line on SIGTERM; "quiet": a release that logs nothing.
        rank1 = subprocess.Popen([sys.executable, "-c", SGLANG_RANK1,
                                  "log" if logs else "quiet"], env=env, stdout=out)
    try:
        wait_for(lambda: "ready" in log.read_text())
        started = time.monotonic()
        report = procs.stop_deployment(marker, term_timeout=60, node_rank=1, log_file=str(log))
        took = time.monotonic() - started
        assert report["kill_sent"] == [rank1.pid] and report["remaining"] == []
        if logs:
            assert took < procs.NONZERO_RANK_TERM_GRACE
            assert "logged that it only waits for rank 0" in report["escalated"]
        else:
            assert procs.NONZERO_RANK_TERM_GRACE <= took < procs.NONZERO_RANK_TERM_GRACE + 5
            assert "non-zero ranks only log it" in report["escalated"]
        # Rank 0 keeps the full timeout: SGLang drains requests there.
        assert procs.wait_after_term({}, 60, node_rank=0) == ([], None)
    finally:
        rank1.kill()
        rank1.wait()


def test_secret_flags_are_masked_in_reported_command_lines():
    assert procs.mask_argv(["python", "--api-key", "sk-1", "--port", "1"]) == [
        "python", "--api-key", "********", "--port", "1"]
    assert procs.mask_argv(["--api-key=sk-1"]) == ["--api-key=********"]
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)",
                             "--api-key", "sk-visible"])
    try:
        # Poll until the child has exec'd: between fork and exec its cmdline is not yet its own.
        info = wait_for(lambda: (i := procs.process_info(proc.pid)) and "--api-key" in
                        i["cmdline"] and i)
        assert "sk-visible" not in info["cmdline"] and "--api-key ********" in info["cmdline"]
    finally:
        proc.kill()
        proc.wait()


def test_supervisor_runs_the_server_as_the_service_user(marker):
    """Members must run as the service user: the supervisor starts the script as that user,
    and membership with the user's uid finds exactly its processes."""
    import tempfile
    folder = Path(tempfile.mkdtemp(prefix="sglang-fleet-user-"))
    try:
        folder.chmod(0o755)  # the service user reads the script and writes nothing here
        script = folder / "launch.sh"
        script.write_text("#!/bin/sh\necho started as $(id -u)\nexec sleep 600\n")
        script.chmod(0o755)
        sup = Supervisor(marker, str(script), str(folder / "s.log"), str(folder / "s.pid"),
                         str(folder), user="nobody")
        sup.start("d", "0123456789ab")
        status = wait_for(lambda: sup.status()["running"] and sup.status())
        assert {p["uid"] for p in status["members"]} == {65534}
        wait_for(lambda: "started as 65534" in (folder / "s.log").read_text())
        assert sup.stop(5)["remaining"] == []
        # Its wrapper, running as that user too, records the exit status in the run folder.
        script.write_text("#!/bin/sh\nexit 3\n")
        sup.start("d", "0123456789ab")
        assert wait_for(lambda: (folder / "s.pid.exit").read_text().strip()) == "3"
    finally:
        procs.stop_deployment(marker, 1, uid=65534)
        shutil.rmtree(folder)


def test_a_failed_binds_holder_is_named_with_its_pid_and_command():
    import socket

    from sglang_fleet.node.health.observe import bind_holders
    from sglang_fleet.node.logs.logphase import parse_log

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        log = parse_log("[2026-12-03 10:00:04] ERROR:    [Errno 98] error while attempting to "
                        f"bind on address ('127.0.0.1', {port}): address already in use\n")
        found = bind_holders(log["cause"], set())
        assert found["port"] == port and found["held"]
        assert found["holders"] and found["holders"][0].startswith(f"{os.getpid()} (")
        # The server's own processes are never named as the holder.
        assert bind_holders(log["cause"], {os.getpid()})["holders"] == []
    assert bind_holders(log["cause"], set())["held"] is False


def test_a_kernel_log_the_node_cannot_read_is_said_with_why(monkeypatch):
    from sglang_fleet.node.health import observe

    def refused(path, flags):
        raise PermissionError(1, "Operation not permitted", path)

    assert observe.kernel_log_error("/var/sim/kernel.log") is None  # a simulated node's file
    monkeypatch.setattr(observe.os, "open", refused)
    assert observe.kernel_log_error("kmsg") == "/dev/kmsg: Operation not permitted"
