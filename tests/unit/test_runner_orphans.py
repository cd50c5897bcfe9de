"""ansible-runner spawns ansible-playbook with pexpect; the CLI's runner module makes every
such spawn end when the CLI dies (SIGKILL included), so no run outlives it holding a lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import ansible_runner.runner

CHILD = """
import sys, time
import ansible_runner.runner
import sglang_fleet.runs.runner  # noqa: F401  (installs the spawn that ends with this process)
# As ansible-runner spawns it: SIGHUP ignored, so the pty closing with the parent ends nothing.
child = ansible_runner.runner.pexpect.spawn(
    sys.executable, ["-c", "import time; time.sleep(120)"], ignore_sighup=True)
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_ansible_runner_spawns_through_the_cli_s_pexpect():
    import sglang_fleet.runs.runner as runner
    assert isinstance(ansible_runner.runner.pexpect, runner._PexpectEndingWithTheCli)
    assert ansible_runner.runner.pexpect.EOF is runner.pexpect.EOF


def test_a_spawned_run_ends_when_the_process_that_spawned_it_is_sigkilled():
    parent = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    spawned = None
    try:
        spawned = int(parent.stdout.readline())
        assert _alive(spawned)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 20
        while _alive(spawned) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(spawned), "the spawned process outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if spawned and _alive(spawned):
            os.kill(spawned, signal.SIGKILL)
