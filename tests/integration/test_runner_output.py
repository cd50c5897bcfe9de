"""deploy.yml through plain ansible_runner.run, as AWX runs a job: with the documented settings
(docs/cli.md, "Under ansible-runner and AWX") the NODE, GATE and ready lines are in the runner's
stdout and in its job events, the same lines as ansible-playbook prints."""

from __future__ import annotations

import re

import ansible_runner
import pytest

from sglang_fleet.testfleet.local import BIN, REPO, make_fleet

pytestmark = pytest.mark.integration

LINE = re.compile(r"^(NODE \[|GATE \[|ok: \[sim-node-\d\] => sim-node-\d: ready at )")


def operator_lines(text: str) -> list[str]:
    """The NODE, GATE and ready lines, without the pids and hashes that differ between runs."""
    return sorted(re.sub(r"\d+", "N", line) for line in text.splitlines() if LINE.match(line))


def runner_deploy(fleet, tmp_path):
    """The documented setting: the collection's stdout callback by its full name;
    ansible-runner keeps its own event callback around it (ORIGINAL_STDOUT_CALLBACK)."""
    envvars = {"ANSIBLE_STDOUT_CALLBACK": "sglang.fleet.sglang_fleet",
               "ANSIBLE_NOCOLOR": "1", "PATH": f"{BIN}:/usr/bin:/bin"}
    tmp_path.mkdir(parents=True)
    run = ansible_runner.run(private_data_dir=str(tmp_path), project_dir=str(REPO),
                             playbook="deploy.yml", inventory=str(fleet.inventory),
                             extravars=fleet.extra, envvars=envvars, quiet=True)
    return run, run.stdout.read(), list(run.events)


def test_the_runners_output_and_events_hold_the_gate_and_node_lines(tmp_path):
    fleet = make_fleet(tmp_path / "fleet", hosts=2)
    try:
        run, stdout, events = runner_deploy(fleet, tmp_path / "first")
        assert run.rc == 0, stdout[-3000:]
        for host in fleet.hosts:
            assert f"NODE [{host}]: " in stdout and f"GATE [{host}]: ready" in stdout, stdout
            # AWX shows the job's events: the GATE line is in the event of the task that
            # judged the host.
            assert any(f"GATE [{host}]: ready" in (e.get("stdout") or "")
                       and e["event"] == "runner_on_ok" for e in events), host
        again_runner, again_stdout, _ = runner_deploy(fleet, tmp_path / "again")
        assert again_runner.rc == 0, again_stdout[-3000:]
        again_playbook = fleet.deploy()
        assert again_playbook.rc == 0, again_playbook.output[-3000:]
        lines = operator_lines(again_playbook.output)
        # A re-run: each host's NODE line and its ready line (the node check's ready verdict
        # is said by the ready line, without a GATE line of its own).
        assert len(lines) == 2 * len(fleet.hosts), again_playbook.output
        assert operator_lines(again_stdout) == lines
    finally:
        fleet.kill_leftovers()
