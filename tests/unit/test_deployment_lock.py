"""The deployment lock: owners named by host, PID, start time and boot; a gone owner's lock is
taken over by compare-and-swap, never a live one's; a recovery's progress kept in it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest

from sglang_fleet_node import sglang_fleet_lock as lk


def record(run, purpose="deploy"):
    return {"owner": f"{purpose} of n:d", "purpose": purpose, "name": "n:d", "since": 1.0,
            "run": run}


@pytest.fixture
def live_run():
    """A live process standing for another ansible-playbook run on this controller."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield lk.run_identity(proc.pid), proc
    proc.kill()
    proc.wait()


def dead_run():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = lk.run_identity(proc.pid)
    proc.wait()
    return identity


def test_free_lock_is_acquired_reentered_by_the_same_run_and_released(tmp_path):
    lock = lk.LockFile(str(tmp_path / "d.lock"))
    me = lk.run_identity(os.getpid())
    assert lock.acquire(record(me)) == ("acquired", None)
    assert (tmp_path / "d.lock").stat().st_mode & 0o777 == 0o600
    outcome, held = lock.acquire(record(me, "recover"))
    assert outcome == "reentered" and held["purpose"] == "deploy"
    assert lock.release(me) and not (tmp_path / "d.lock").exists()
    assert not lock.release(me)


def test_a_live_owner_keeps_its_lock(tmp_path, live_run):
    other, _ = live_run
    lock = lk.LockFile(str(tmp_path / "d.lock"))
    lock.acquire(record(other))
    me = lk.run_identity(os.getpid())
    outcome, held = lock.acquire(record(me))
    assert outcome == "held" and held["run"] == other
    assert lk.owner_gone(other, me) is None
    assert not lock.release(me), "only the owner releases"
    # A take-over naming a record that is not the one held changes nothing.
    assert lock.acquire(record(me), take_over=dict(record(other), since=2.0))[0] == "held"


def test_a_gone_owner_is_recognised_by_pid_start_time_and_boot(live_run):
    alive, proc = live_run
    here = lk.run_identity(os.getpid())
    gone = dead_run()
    assert "is gone" in lk.owner_gone(gone, here)
    reused = dict(alive, start_ticks=alive["start_ticks"] - 1)  # that PID, another process
    assert "is now another process" in lk.owner_gone(reused, here)
    rebooted = dict(alive, boot_id="another-boot")
    assert "rebooted" in lk.owner_gone(rebooted, here)
    elsewhere = dict(gone, host="another-controller")
    assert lk.owner_gone(elsewhere, here) is None, "cannot be checked from here"


def test_take_over_is_compare_and_swap_one_winner(tmp_path):
    path = str(tmp_path / "d.lock")
    gone = dead_run()
    lk.LockFile(path).acquire(dict(record(gone, "recover"), recovery={"stage": "stopped"}))
    held = lk.LockFile(path).read()
    contenders = [dict(lk.run_identity(os.getpid()), pid=os.getpid() + 10_000 + i)
                  for i in range(8)]
    outcomes = {}

    def take(run):
        outcomes[run["pid"]] = lk.LockFile(path).acquire(record(run), take_over=held)[0]

    threads = [threading.Thread(target=take, args=(run,)) for run in contenders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes.values()).count("taken_over") == 1
    winner = next(pid for pid, outcome in outcomes.items() if outcome == "taken_over")
    assert lk.LockFile(path).read()["run"]["pid"] == winner


def test_recovery_progress_is_kept_in_the_lock_and_only_by_its_owner(tmp_path, live_run):
    path = str(tmp_path / "d.lock")
    me = lk.run_identity(os.getpid())
    lock = lk.LockFile(path)
    lock.acquire(record(me, "recover"))
    lock.update(me, {"stage": "stopped", "failed_config_hash": "0123456789ab"})
    lock.update(me, {"stage": "chosen", "next": {"overrides": {"x": 1}}})
    progress = lock.read()["recovery"]
    assert progress == {"stage": "chosen", "failed_config_hash": "0123456789ab",
                        "next": {"overrides": {"x": 1}}}
    other, _ = live_run
    with pytest.raises(lk.LockError, match="not this run"):
        lock.update(other, {"stage": "recorded"})
    assert "unfinished recovery (stage chosen)" in lk.describe(lock.read())


def test_the_controller_run_is_the_parent_ansible_process():
    run = lk.controller_run()
    assert run["host"] == socket.gethostname() and run["start_ticks"] is not None
    assert run["pid"] in (os.getpid(), os.getppid())
