"""Node-side process membership, the supervisor and the systemd driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from sglang_fleet.testfleet.local import wait_for
from sglang_fleet_node import sglang_fleet_procs as procs
from sglang_fleet_node.sglang_fleet_service import Supervisor, Systemd, files_digest

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


def test_supervisor_detaches_keeps_log_and_records_digest(marker, tmp_path):
    script = tmp_path / "launch.sh"
    script.write_text(f"#!/bin/bash\necho started-$$\nexec {sys.executable} -c 'import time\n"
                      "while True: time.sleep(1)'\n")
    script.chmod(0o755)
    log, state = tmp_path / "logs" / "s.log", tmp_path / "run" / "s.pid"
    sup = Supervisor(marker, str(script), str(log), str(state), str(tmp_path))
    pid = sup.start("digest-1")
    status = wait_for(lambda: sup.status()["running"] and sup.status())
    assert status["pid"] == pid and status["digest"] == "digest-1"
    assert os.getsid(pid) == pid  # its own session: ansible's process group cannot take it down
    wait_for(lambda: "started-" in log.read_text())
    assert sup.stop(5)["remaining"] == []
    sup.start("digest-2")
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
    from sglang_fleet_node.sglang_fleet_service import ServiceError
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
    # still ties the renamed worker to its deployment.
    code = ("import os, time, setproctitle\n"
            "setproctitle.setproctitle('sglang::scheduler_TP0')\n"
            "print('ready', flush=True)\nwhile True: time.sleep(1)\n")
    env = {k: v for k, v in os.environ.items() if k != "SPT_NOENV"}
    env[procs.MARKER_VAR] = marker
    worker = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        assert worker.stdout.readline().strip() == "ready"
        assert worker.pid not in {p["pid"] for p in procs.deployment_processes(marker)}
        found = procs.deployment_processes(marker, session_id=worker.pid)
        assert [p["cmdline"] for p in found] == ["sglang::scheduler_TP0"]
    finally:
        worker.kill()
        worker.wait()


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
