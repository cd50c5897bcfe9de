"""The deployment lock: owners named by a run id; an owner proven gone (by its PID on the same
kernel and PID namespace, by its lease, or an empty lock) is taken over by compare-and-swap,
never a live one; a recovery's progress kept in it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from sglang_fleet.node.deploy import lock as lk
from sglang_fleet.testfleet.local import wait_for


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


def test_a_gone_owner_is_recognised_by_pid_and_start_time_on_this_kernel_and_namespace(
        live_run):
    alive, proc = live_run
    here = lk.run_identity(os.getpid())
    gone = dead_run()
    assert "is gone" in lk.owner_gone(gone, here)
    reused = dict(alive, start_ticks=alive["start_ticks"] - 1)  # that PID, another process
    assert "is now another process" in lk.owner_gone(reused, here)
    assert lk.owner_gone(alive, here) is None


def test_a_pid_proves_nothing_from_another_pid_namespace_kernel_or_machine(live_run):
    """Trial: a controller in another PID namespace on the same host (a container with host
    networking) looked dead, and its live lock was taken; two machines with one host name
    read as "its controller has rebooted". A PID is checked only on the same kernel and in
    the same PID namespace; the host name proves nothing."""
    alive, _ = live_run
    here = lk.run_identity(os.getpid())
    gone = dead_run()
    other_namespace = dict(gone, pid_ns="pid:[4026599999]")
    # From a controller that is itself in a container (not the initial PID namespace).
    in_a_container = dict(here, pid_ns="pid:[4026500001]")
    assert lk.owner_gone(other_namespace, in_a_container) is None
    same_name_other_machine = dict(alive, boot_id="another-boot")
    assert lk.owner_gone(same_name_other_machine, here) is None
    assert lk.owner_gone(dict(gone, boot_id="another-boot"), here) is None
    # The same host name from another machine is not the same run either.
    assert not lk.same_run(dict(here, run_id="0" * 20), here)


def test_the_run_id_names_one_process_on_one_kernel_and_namespace():
    me = lk.run_identity(os.getpid())
    assert me["run_id"] == lk.run_identity(os.getpid())["run_id"], "stable for one run"
    assert me["pid_ns"] == os.readlink("/proc/self/ns/pid")
    parent = lk.run_identity(os.getppid())
    assert parent["run_id"] != me["run_id"]
    assert lk.same_run(me, dict(me, host="renamed")), "the host name is for people"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare")
                    or os.readlink("/proc/self/ns/pid") != lk.INIT_PID_NS,
                    reason="a PID namespace needs root and unshare(1), seen from the initial one")
def test_a_run_in_another_pid_namespace_is_judged_from_the_initial_pid_namespace_only():
    """Trial: a lock left by a dead controller in another PID namespace blocked even a stop
    for its whole lease. From the kernel's initial PID namespace every process is visible,
    with its PID in its own namespace: the run is found alive, or proven gone."""
    here = lk.run_identity(os.getpid())
    code = ("import json, os, time; from sglang_fleet.node.deploy import lock as lk; "
            "print(json.dumps(lk.run_identity(os.getpid())), flush=True); time.sleep(60)")
    holder = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable,
                               "-c", code], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        inside = json.loads(holder.stdout.readline())
        assert inside["pid"] == 1 and inside["pid_ns"] != here["pid_ns"]
        assert not lk.same_run(inside, here)
        assert lk.owner_checkable(inside, here) and not lk.pid_checkable(inside, here)
        assert lk.owner_gone(inside, here) is None, "found alive in its namespace"
        assert "is now another process" in lk.owner_gone(
            dict(inside, start_ticks=inside["start_ticks"] - 1), here)
        in_a_container = dict(here, pid_ns="pid:[4026500001]")
        assert lk.owner_gone(dict(inside, pid=12345), in_a_container) is None, \
            "from another container nothing is proven"
    finally:
        os.killpg(holder.pid, 9)  # its whole PID namespace goes with it
        holder.wait()
    # The namespace's init is reaped by the kernel a moment after its parent: polled, not slept.
    gone = wait_for(lambda: lk.owner_gone(inside, here), timeout=10)
    assert "is gone (no process of its kernel is that run" in gone


def lease_record(run, lease, silent_for):
    """A lock its run renewed `silent_for` seconds ago, with `lease`."""
    rec = lk.lock_record("n:d", "deploy", run, lease=lease)
    rec["renewed"] -= silent_for
    rec["renewed_uptime"] -= silent_for
    return rec


def test_a_lock_not_renewed_for_longer_than_its_lease_is_stale_and_taken_over(tmp_path,
                                                                             live_run):
    other, _ = live_run
    other = dict(other, pid_ns="pid:[4026599999]")  # alive or not: nobody here can tell
    path = str(tmp_path / "d.lock")
    lock = lk.LockFile(path)
    lk.LockFile(path)._create(lease_record(other, lease=60, silent_for=30))
    me = lk.run_identity(os.getpid())
    outcome, held = lock.acquire(lk.lock_record("n:d", "deploy", me))
    assert outcome == "held" and "stale" not in held, "within its lease: alive"
    lock._store(lease_record(other, lease=60, silent_for=61))
    outcome, held = lock.acquire(lk.lock_record("n:d", "deploy", me))
    assert outcome == "held"
    assert "has not renewed the lock for 61 s, longer than its lease (60 s)" in held["stale"]
    assert lock.acquire(lk.lock_record("n:d", "deploy", me), take_over=held)[0] == "taken_over"
    assert lock.read()["run"]["run_id"] == me["run_id"]


def test_the_lease_is_timed_on_the_boot_clock_not_the_wall_clock(tmp_path):
    """A step of the wall clock (or a time zone) neither ages nor refreshes a lease."""
    me = lk.run_identity(os.getpid())
    fresh = lk.lock_record("n:d", "deploy", me, lease=60)
    assert lk.stale_reason(dict(fresh, renewed=fresh["renewed"] - 86400)) is None
    old = lease_record(me, lease=60, silent_for=120)
    assert lk.stale_reason(dict(old, renewed=old["renewed"] + 86400)) is not None
    # After the node rebooted, the boot clock of the renewal means nothing: the wall clock.
    rebooted = dict(old, renewed_boot="another-boot", renewed_uptime=0.0)
    assert "120 s" in lk.stale_reason(rebooted)


def test_a_renewal_defeats_a_take_over_decided_before_it(tmp_path):
    path = str(tmp_path / "d.lock")
    other = dict(dead_run(), pid_ns="pid:[4026599999]")
    lock = lk.LockFile(path)
    lock._create(lease_record(other, lease=1, silent_for=5))
    me = lk.run_identity(os.getpid())
    _, stale = lock.acquire(lk.lock_record("n:d", "deploy", me))
    assert stale["stale"]
    assert lock.renew(other, lease=600), "its owner was alive after all"
    assert lock.acquire(lk.lock_record("n:d", "deploy", me), take_over=stale)[0] == "held"
    assert lock.read()["run"] == other and lock.read()["lease_s"] == 600


def test_the_owner_renews_its_lease_and_nobody_else_does(tmp_path, live_run):
    path = str(tmp_path / "d.lock")
    me = lk.run_identity(os.getpid())
    lock = lk.LockFile(path)
    lock._create(lease_record(me, lease=60, silent_for=50))
    assert lk.silence(lock.read()) >= 50
    other, _ = live_run
    assert not lock.renew(other)
    assert lk.silence(lock.read()) >= 50
    assert lock.renew(me)
    assert lk.silence(lock.read()) < 5
    # A reentry renews it too, with the lease it declares.
    outcome, held = lock.acquire(lk.lock_record("n:d", "recover", me, lease=1234))
    assert outcome == "reentered" and held["lease_s"] == 1234 and lk.silence(held) < 5


def test_an_empty_lock_file_is_taken_over_after_a_grace_not_retried_forever(tmp_path):
    """Trial: an empty lock file blocked deployments forever ("it keeps appearing and
    disappearing"). sglang-fleet never leaves a lock empty (it writes the record whole, then
    links it into place), so an empty one older than a grace names no owner: stale."""
    path = tmp_path / "d.lock"
    path.write_bytes(b"")
    past = time.time() - lk.EMPTY_GRACE_S - 1
    os.utime(path, (past, past))
    me = lk.run_identity(os.getpid())
    lock = lk.LockFile(str(path))
    outcome, held = lock.acquire(lk.lock_record("n:d", "deploy", me))
    assert outcome == "held" and "the lock file is empty" in held["stale"]
    assert "empty lock file" in lk.describe(held)
    assert lock.acquire(lk.lock_record("n:d", "deploy", me), take_over=held)[0] == \
        "taken_over"
    assert lock.read()["run"]["run_id"] == me["run_id"]


def test_a_fresh_empty_lock_gets_its_grace_then_counts_as_stale(tmp_path, monkeypatch):
    monkeypatch.setattr(lk, "EMPTY_GRACE_S", 1.0)  # the rule, not the production length
    path = tmp_path / "d.lock"
    path.write_bytes(b"")
    me = lk.run_identity(os.getpid())
    started = time.monotonic()
    outcome, held = lk.LockFile(str(path)).acquire(lk.lock_record("n:d", "deploy", me))
    assert outcome == "held" and held["stale"]
    assert lk.EMPTY_GRACE_S <= time.monotonic() - started < lk.EMPTY_GRACE_S + 6


def test_an_unreadable_lock_is_refused_with_what_it_holds_never_taken(tmp_path):
    path = tmp_path / "d.lock"
    path.write_text('{"owner": "deploy of n:d", "run": {"pid"')
    past = time.time() - 86400
    os.utime(path, (past, past))
    me = lk.run_identity(os.getpid())
    outcome, held = lk.LockFile(str(path)).acquire(lk.lock_record("n:d", "deploy", me))
    assert outcome == "held" and "stale" not in held
    assert "an unreadable lock file (it holds '{\"owner\"" in lk.describe(held)


def test_locks_are_written_whole_and_never_through_a_link(tmp_path):
    me = lk.run_identity(os.getpid())
    lock = lk.LockFile(str(tmp_path / "d.lock"))
    lock.acquire(lk.lock_record("n:d", "deploy", me))
    lock.update(me, {"stage": "stopped"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.lock"], "no temporary left"
    assert (tmp_path / "d.lock").stat().st_mode & 0o777 == 0o600
    lock.release(me)
    target = tmp_path / "elsewhere"
    target.write_text("precious")
    (tmp_path / "d.lock").symlink_to(target)
    with pytest.raises(lk.LockError, match="is a symbolic link"):
        lock.acquire(lk.lock_record("n:d", "deploy", me))
    assert target.read_text() == "precious"


def test_a_lock_that_is_a_folder_is_refused_naming_the_path_and_the_fix(tmp_path):
    me = lk.run_identity(os.getpid())
    (tmp_path / "d.lock").mkdir()
    lock = lk.LockFile(str(tmp_path / "d.lock"))
    for attempt in (lambda: lock.acquire(lk.lock_record("n:d", "deploy", me)), lock.read,
                    lambda: lock.release(me)):
        with pytest.raises(lk.LockError) as refused:
            attempt()
        assert str(refused.value) == (
            f"{tmp_path / 'd.lock'} is a folder: a lock is a plain file. Fix: if no deploy, "
            f"recover or stop of this deployment is running, remove the folder "
            f"(rmdir {tmp_path / 'd.lock'})")
    assert (tmp_path / "d.lock").is_dir()


def test_the_lease_covers_the_gates_a_host_waits_for():
    assert lk.lease_for(600, hosts=1, forks=16) == 600 + lk.LEASE_MARGIN_S
    assert lk.lease_for(600, hosts=64, forks=16) == 4 * 600 + lk.LEASE_MARGIN_S
    assert lk.lease_for(600, hosts=17, forks=16) == 2 * 600 + lk.LEASE_MARGIN_S


def test_take_over_is_compare_and_swap_one_winner(tmp_path):
    path = str(tmp_path / "d.lock")
    gone = dead_run()
    lk.LockFile(path).acquire(dict(record(gone, "recover"), recovery={"stage": "stopped"}))
    held = lk.LockFile(path).read()
    contenders = [dict(lk.run_identity(os.getpid()), pid=os.getpid() + 10_000 + i,
                       run_id=f"contender-{i}") for i in range(8)]
    outcomes = {}

    def take(run):
        outcomes[run["pid"]] = lk.LockFile(path).acquire(record(run), take_over=held)[0]

    threads = [threading.Thread(target=take, args=(run,)) for run in contenders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes.values()).count("taken_over") == 1
    assert sorted(outcomes.values()).count("held") == 7
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


def test_a_stop_waits_for_an_uncheckable_owner_only_while_it_renews():
    held = {"run": {"run_id": "x", "pid": 41}, "lease_s": 16560.0}
    assert lk.stop_may_take_over(held, 60.0, checkable=False) is None
    assert lk.stop_may_take_over(held, lk.STOP_WAIT_S + 1, checkable=True) is None, \
        "an owner checked by its PID is judged by it"
    assert lk.stop_may_take_over({"unreadable": True}, 10_000.0, checkable=False) is None
    why = lk.stop_may_take_over(held, 1000.0, checkable=False)
    assert why == ("its run cannot be checked from here and has not renewed the lock for "
                   "1000 s; a stop waits at most 900 s for such a run, not its whole lease "
                   "(16560 s)")
