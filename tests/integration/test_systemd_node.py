"""The real-node path under a real systemd: servers deployed with service_manager systemd onto
test nodes that each boot an isolated systemd (sglang_fleet.testfleet.systemd_node), reached
over SSH with sudo. The isolation is a test of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from sglang_fleet.testfleet.local import FAST_GATE, run_playbook, wait_for
from sglang_fleet.testfleet.systemd_node import (
    NODES_ROOT,
    IsolationError,
    boot_node,
    make_systemd_fleet,
    unavailable,
)

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]


def _machine_state() -> dict:
    """What a node must not change on the machine: its /tmp, sysctls, /dev, mounts, units."""
    return {
        "pid_max": Path("/proc/sys/kernel/pid_max").read_text(),
        "protected_regular": Path("/proc/sys/fs/protected_regular").read_text(),
        "dev_log": os.path.lexists("/dev/log"),
        # Other tests (run in parallel) mount file systems in their own temp folders.
        "mounts": sorted(point for point in (line.split()[4] for line in
                         Path("/proc/self/mountinfo").read_text().splitlines())
                         if not point.startswith("/tmp/pytest-of-")),
        "units": sorted(os.listdir("/etc/systemd/system")),
    }


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("systemd-fleet")
    fleet = make_systemd_fleet(tmp, hosts=2)
    yield fleet
    fleet.close()


def _deploy(fleet, *args, extra=None):
    return run_playbook("deploy.yml", fleet.inventory, {**fleet.extra, **(extra or {})}, *args)


def _journal_reloads(machine) -> int:
    return machine.journal().count("Reloading.")


def test_the_node_is_isolated_and_refuses_to_boot_without_isolation(tmp_path):
    canary = Path("/tmp") / f"sglang-fleet-isolation-canary-{os.getpid()}"
    canary.write_text("must survive")
    before = _machine_state()
    fleet = make_systemd_fleet(tmp_path, hosts=1)
    try:
        machine = fleet.machine("systemd-node-1")
        node_cgroups = list(machine.cgroups)
        assert node_cgroups
        # sshd answers before the last boot units finish on a loaded machine: wait for the
        # boot to end (systemctl's own wait), then the node must be fully up.
        assert machine.systemctl("is-system-running", "--wait") == "running"
        # Inside: its own /tmp (no canary), a read-only /proc/sys, its own cgroup root.
        assert machine.run("test", "-e", str(canary)).returncode == 1
        assert machine.run("sh", "-c", "echo 1 > /proc/sys/kernel/pid_max").returncode != 0
        run = _deploy(fleet)
        assert run.rc == 0, run.output[-3000:]
    finally:
        fleet.close()
    assert canary.read_text() == "must survive"
    canary.unlink()
    assert _machine_state() == before
    assert not [c for c in node_cgroups if c.exists()]
    # A node that cannot set up its isolation says why and boots nothing.
    with pytest.raises(IsolationError, match="is under /tmp, which the node replaces"):
        boot_node("refused", "127.0.0.99", 1, tmp_path / "sshd_config", tmp_path)
    assert not any(p.name.startswith("sglang-fleet-test-refused")
                   for p in Path("/sys/fs/cgroup/systemd").iterdir())
    assert NODES_ROOT.is_dir()


def test_deploy_is_ready_and_a_rerun_changes_nothing(fleet):
    run = _deploy(fleet)
    assert run.rc == 0, run.output[-3000:]
    machine = fleet.machine("systemd-node-1")
    unit = fleet.unit("systemd-node-1")
    assert machine.unit_property(unit, "ActiveState") == "active"
    assert (machine.unit_dir / unit).exists(), "the unit file is in the node's own folder"
    assert not Path("/etc/systemd/system", unit).exists()
    pid = machine.unit_property(unit, "MainPID")
    started = machine.unit_property(unit, "ExecMainStartTimestampMonotonic")
    reloads = _journal_reloads(machine)
    again = _deploy(fleet)
    assert again.rc == 0 and again.changed_hosts() == set(), again.output[-3000:]
    assert machine.unit_property(unit, "MainPID") == pid
    assert machine.unit_property(unit, "ExecMainStartTimestampMonotonic") == started
    assert _journal_reloads(machine) == reloads, "a re-run needs no daemon-reload"


def test_one_variable_change_restarts_only_that_unit(fleet):
    assert _deploy(fleet).rc == 0
    one, two = (fleet.machine(h) for h in ("systemd-node-1", "systemd-node-2"))
    pid_two = two.unit_property(fleet.unit("systemd-node-2"), "MainPID")
    fleet.set_host_vars("systemd-node-1", {"sglang_server_num_continuous_decode_steps": 2})
    try:
        run = _deploy(fleet)
        assert run.rc == 0, run.output[-3000:]
        assert run.changed_hosts() == {"systemd-node-1"}
        assert two.unit_property(fleet.unit("systemd-node-2"), "MainPID") == pid_two
        argv = one.run("cat", f"/proc/{one.unit_property(fleet.unit('systemd-node-1'), 'MainPID')}"
                       "/cmdline").stdout
        assert "--num-continuous-decode-steps\x002" in argv
        # The unit's log keeps every run, each opened by its own separator.
        log = fleet.log_file("systemd-node-1").read_text()
        assert log.count("===== sglang-fleet: start systemd-node-1:") >= 2
        assert log.count("The server is fired up and ready to roll!") >= 2
    finally:
        fleet.set_host_vars("systemd-node-1", {})


def test_cgroup_membership_finds_every_worker_and_stop_ends_exactly_the_unit(fleet):
    """A server that drains forever on SIGTERM (a generation in flight that never ends), with
    an orphan that carries no marker: stop.yml ends every process of the unit, within
    TimeoutStopSec, and nothing else on the node."""
    host = "systemd-node-2"
    fleet.set_host_vars(host, {"sglang_server_stop_timeout": 5})
    machine, unit = fleet.machine(host), fleet.unit(host)
    bystander_pid = None
    try:
        assert _deploy(fleet, "--limit", host).rc == 0
        # The server hangs in generation from now on (the simulator's switch), and a request
        # that never finishes keeps it draining on SIGTERM.
        assert machine.run("kill", "-USR1", machine.unit_property(unit, "MainPID")).returncode == 0
        stuck = subprocess.Popen(["curl", "-s", "-m", "120", "-X", "POST", "-d",
                                  '{"text": "x", "sampling_params": {"max_new_tokens": 4}}',
                                  f"{fleet.url(host)}/generate"], stdout=subprocess.DEVNULL)
        # An orphan in the unit's cgroup with no marker and its own session.
        cgroup = machine.unit_property(unit, "ControlGroup")
        orphan = machine.run("sh", "-c", f"setsid env -i sleep 1000 >/dev/null 2>&1 & echo $! > "
                             f"/sys/fs/cgroup/systemd{cgroup}/cgroup.procs; echo $!")
        orphan_pid = int(orphan.stdout.split()[-1])
        bystander = machine.run("sh", "-c", "setsid sleep 1000 >/dev/null 2>&1 & echo $!")
        bystander_pid = int(bystander.stdout.split()[-1])
        # Membership by the unit's cgroup (run inside the node, as the modules do) finds the
        # orphan, which carries no marker and is in no session of the server's.
        marker = f"{host}:Kimi-K2.5-{fleet.port(host)}"
        found = machine.run(sys.executable, "-c", (
            "from sglang_fleet.node.process.procs import deployment_processes as d\n"
            f"print(' '.join(str(p['pid']) for p in d({marker!r}, unit={unit!r})))"))
        members = {int(pid) for pid in found.stdout.split()}
        assert orphan_pid in members and bystander_pid not in members, found
        assert len(members) >= 4  # launch script, main, scheduler, detokenizer, orphan
        started = time.monotonic()
        stop = run_playbook("playbooks/stop.yml", fleet.inventory, fleet.extra, "--limit", host)
        took = time.monotonic() - started
        assert stop.rc == 0, stop.output[-3000:]
        assert machine.run("sh", "-c", f"cat /sys/fs/cgroup/systemd{cgroup}/cgroup.procs "
                           "2>/dev/null").stdout.strip() == ""
        assert orphan.returncode == 0
        assert machine.run("kill", "-0", str(bystander_pid)).returncode == 0, "bystander lives"
        assert took < 5 + 30, f"stop took {took:.0f} s for TimeoutStopSec=5"
        stuck.wait(30)
        # Recovery of the same kind of server (unhealthy: generation hangs, draining forever)
        # stops exactly the unit's processes too, and brings it back.
        assert _deploy(fleet, "--limit", host).rc == 0
        assert machine.run("kill", "-USR1", machine.unit_property(unit, "MainPID")).returncode == 0
        stuck = subprocess.Popen(["curl", "-s", "-m", "120", "-X", "POST", "-d",
                                  '{"text": "x", "sampling_params": {"max_new_tokens": 4}}',
                                  f"{fleet.url(host)}/generate"], stdout=subprocess.DEVNULL)
        recover = run_playbook("playbooks/recover.yml", fleet.inventory,
                               {**fleet.extra, "sglang_recover_term_timeout": 5},
                               "--limit", host)
        assert recover.rc == 0, recover.output[-3000:]
        assert f"{host}: recovered" in recover.output
        assert machine.run("kill", "-0", str(bystander_pid)).returncode == 0, "bystander lives"
        assert machine.unit_property(unit, "ActiveState") == "active"
        stuck.wait(60)
    finally:
        if bystander_pid:
            machine.run("kill", str(bystander_pid))
        fleet.set_host_vars(host, {})


def test_a_crash_shows_in_the_unit_and_in_the_gate(fleet):
    host = "systemd-node-1"
    fleet.set_host_vars(host, {"sglang_server_sim_fault": "crash:loading_weights",
                               **FAST_GATE})
    machine, unit = fleet.machine(host), fleet.unit(host)
    try:
        run = _deploy(fleet, "--limit", host)
        assert run.rc != 0
        assert "crashed in loading_weights" in run.output
        # As SGLang 0.5.23 does, the main process kills itself with SIGKILL once a child
        # reports its failure: the unit records the signal, the gate its exit status.
        status = machine.unit_property(unit, "ExecMainStatus")
        assert status in ("1", "9"), status
        assert f"the server exited (status {128 + 9 if status == '9' else 1}" in run.output
        assert machine.unit_property(unit, "ActiveState") in ("failed", "inactive")
    finally:
        fleet.set_host_vars(host, {})
    assert _deploy(fleet, "--limit", host).rc == 0


def test_systemd_analyze_verify_accepts_the_rendered_units(fleet):
    assert _deploy(fleet).rc == 0
    for host in fleet.hosts:
        machine = fleet.machine(host)
        check = machine.run("systemd-analyze", "verify", f"/etc/systemd/system/{fleet.unit(host)}")
        assert check.returncode == 0, check.stderr
        assert "sglang" not in check.stderr, check.stderr


def test_http_answers_from_the_unit(fleet):
    assert _deploy(fleet).rc == 0
    url = f"{fleet.url('systemd-node-1')}/health"
    assert wait_for(lambda: requests.get(url, timeout=30).status_code == 200, timeout=30)


def test_a_root_with_a_space_and_a_specifier_renders_a_unit_systemd_accepts(fleet):
    """Trial: sglang_server_root "/opt/sglang fleet/50%d" rendered a unit that
    `systemd-analyze verify` rejected ("Command /opt/sglang is not executable"; %d is a
    specifier). Escaped, the node's systemd verifies it, starts it and the server is ready."""
    host = "systemd-node-2"
    machine, unit = fleet.machine(host), fleet.unit(host)
    assert run_playbook("playbooks/stop.yml", fleet.inventory, fleet.extra,
                        "--limit", host).rc == 0
    root = f"{fleet.extra['sglang_fleet_sim_root']}/{host}/sglang fleet/50%d"
    fleet.set_host_vars(host, {"sglang_server_root": root})
    try:
        run = _deploy(fleet, "--limit", host)
        assert run.rc == 0, run.output[-3000:]
        assert f"{host}: ready at" in run.output
        verify = machine.run("systemd-analyze", "verify", "--man=no",
                             f"/etc/systemd/system/{unit}")
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert machine.unit_property(unit, "WorkingDirectory") == root
        assert Path(root, "logs", unit.removeprefix("sglang-").removesuffix(".service")
                    + ".log").read_text().count("fired up and ready to roll") == 1
    finally:
        stop = run_playbook("playbooks/stop.yml", fleet.inventory, fleet.extra, "--limit", host)
        fleet.set_host_vars(host, {})
    assert stop.rc == 0, stop.output[-3000:]
