"""The sglang-fleet command line through ansible-runner, as CI uses it: exit codes, the JSON
summary, the JUnit file, live progress, secrets kept out of every artifact, and watch mode."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from sglang_fleet.testfleet.cli_run import CliRun
from sglang_fleet.testfleet.local import (
    BIN,
    FAST_GATE,
    REPO,
    ansible_env,
    make_fleet,
    run_playbook,
    sglang_fleet,
    wait_for,
)

pytestmark = pytest.mark.integration

API_KEY = "sk-cli-secret-7f3a9c"
HF_TOKEN = "hf_cli_secret_b81d2e"
SHELL_TOKEN = "shell-secret-44c0de"  # an operator's unrelated secret in the environment
NESTED_KEY = "sk-nested-override-5e1f0a9b"  # a key given inside sglang_server_overrides
NESTED_TOKEN = "hf_nested_override_c3d4e5"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = make_fleet(tmp_path_factory.mktemp("cli"), hosts=2, time_factor=0.005)
    fleet.update_group_vars("sglang_servers", {"sglang_server_api_key": API_KEY,
                                               "sglang_server_hf_token": HF_TOKEN})
    fleet.set_host_vars("sim-node-2", {"sglang_server_sim_fault": "hang:loading_weights"})
    # sim-node-1 loads at 0.02 of real time: at 0.005 it could be past every phase but the
    # last before its gate's first observation, which then has no progress to report.
    fleet.set_host_vars("sim-node-1", {"sglang_server_sim_time_factor": 0.02})
    fleet.outputs = []
    yield fleet
    fleet.kill_leftovers()


def cli(fleet, command: str, run_dir: Path, *more: str) -> subprocess.CompletedProcess:
    env = dict(ansible_env(), MY_SERVICE_TOKEN=SHELL_TOKEN)
    proc = subprocess.run(
        [str(BIN / "sglang-fleet"), command, "-i", str(fleet.inventory), "--run-dir",
         str(run_dir), "-e", json.dumps(fleet.with_stores(**FAST_GATE)), *more],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=600)
    fleet.outputs.append(proc.stdout)
    return proc


def junit_cases(path: Path) -> dict[tuple[str, str], ET.Element | None]:
    suite = ET.parse(path).getroot().find("testsuite")
    return {(c.get("classname").removeprefix("sglang-fleet."), c.get("name")): c.find("failure")
            for c in suite.findall("testcase")}


def test_deploy_reports_each_host_and_exits_1_when_one_fails(fleet):
    run_dir = fleet.root.parent / "runs" / "deploy"
    proc = cli(fleet, "deploy", run_dir, "--recover")
    assert proc.returncode == 1, proc.stdout[-3000:]
    # Live progress, line by line when stdout is not a terminal (an observation returns at
    # each phase change).
    assert "GATE [sim-node-1] progressing: " in proc.stdout, proc.stdout[-3000:]
    assert "[sim-node-1] ready at http://127.0.0.1:" in proc.stdout
    assert "FAILED [sim-node-2]" in proc.stdout
    # The table of hosts and verdicts.
    table = proc.stdout[proc.stdout.index("HOST "):]
    assert "sim-node-1  ok      ready" in table and "sim-node-2  failed  stalled" in table
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == 1 and summary["result"] == "hosts failed"
    one, two = summary["hosts"]["sim-node-1"], summary["hosts"]["sim-node-2"]
    assert one["status"] == "ok" and one["verdict"] == "ready"
    assert two["status"] == "failed" and two["verdict"] == "stalled"
    assert two["phase"] == "loading_weights" and Path(two["evidence"]).is_dir()
    assert one["stages"] == {"spec": "passed", "deploy": "passed", "health": "passed"}
    cases = junit_cases(run_dir / "junit.xml")
    assert cases[("sim-node-1", "health")] is None
    failure = cases[("sim-node-2", "health")]
    assert failure is not None and failure.get("message") == "stalled"
    assert "stalled in loading_weights" in failure.text and two["evidence"] in failure.text
    assert cases[("sim-node-2", "recover")] is not None, "recovery redeployed and failed again"
    assert list(run_dir.glob("runner/artifacts/*/job_events/*.json"))


def test_health_exits_1_while_a_server_is_not_ready(fleet):
    run_dir = fleet.root.parent / "runs" / "health"
    proc = cli(fleet, "health", run_dir)
    assert proc.returncode == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["hosts"]["sim-node-1"]["verdict"] == "ready"
    assert summary["hosts"]["sim-node-2"]["verdict"] == "stalled"
    cases = junit_cases(run_dir / "junit.xml")
    assert cases[("sim-node-1", "health")] is None
    assert "stalled in loading_weights" in cases[("sim-node-2", "health")].text


def test_recover_brings_the_failed_host_back_and_exits_0(fleet):
    fleet.set_host_vars("sim-node-2", {})  # the cause is fixed; recovery redeploys
    run_dir = fleet.root.parent / "runs" / "recover"
    proc = cli(fleet, "recover", run_dir, "--limit", "sim-node-2")
    assert proc.returncode == 0, proc.stdout[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    two = summary["hosts"]["sim-node-2"]
    assert two["verdict"] == "ready" and two["recovery"]["verdict"] == "stalled"
    assert Path(two["evidence"]).is_dir()
    cases = junit_cases(run_dir / "junit.xml")
    assert cases[("sim-node-2", "recover")] is None
    health = cli(fleet, "health", fleet.root.parent / "runs" / "health-2")
    assert health.returncode == 0


def test_usage_and_inventory_errors_exit_2_before_any_node_is_touched(fleet, tmp_path):
    missing = sglang_fleet("deploy", "-i", str(tmp_path / "nope"), "--run-dir", str(tmp_path))
    assert missing.returncode == 2 and "no such file or folder" in missing.stdout
    secret = sglang_fleet("deploy", "-i", str(fleet.inventory), "-e",
                          "sglang_server_api_key=oops")
    assert secret.returncode == 2 and "ansible-vault" in secret.stdout
    pid = fleet.main_pid("sim-node-1")
    invalid = cli(fleet, "deploy", tmp_path / "invalid", "-e", "sglang_server_tp=100")
    assert invalid.returncode == 2, invalid.stdout[-2000:]
    summary = json.loads((tmp_path / "invalid" / "summary.json").read_text())
    assert summary["result"] == "usage error"
    assert "sglang_server_tp" in summary["hosts"]["sim-node-1"]["message"]
    assert fleet.main_pid("sim-node-1") == pid


def test_a_refused_typo_shows_its_fix_once_and_whole(fleet, tmp_path):
    run_dir = tmp_path / "typo"
    proc = cli(fleet, "deploy", run_dir, "-e", "sglang_server_attention_backend=flashinfr")
    assert proc.returncode == 2, proc.stdout[-3000:]
    fix = ("Fix: 'flashinfer' is the closest, but rule flashinfer-mla-sm120-graph-capture-hang "
           "refuses it on this hardware: set sglang_server_attention_backend: 'triton'.")
    # Said once, whole, for both hosts: the progress line names the variable, the table's
    # reasons give the fix (one line each in a log).
    assert proc.stdout.count(fix) == 1, proc.stdout
    assert ("FAILED [sim-node-1, sim-node-2] LaunchSpec refused (the same on 2 hosts): "
            "sglang_server_attention_backend") in proc.stdout
    why = proc.stdout[proc.stdout.index("\nwhy:\n"):]
    assert "  sim-node-1, sim-node-2 (the same on 2 hosts):\n    sglang_server_attention_backend=" \
        "'flashinfr': is not one of SGLang 0.5.23's choices" in why
    assert why.count("\n    sglang_server_attention_backend='flashinfr'") == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert fix in summary["hosts"]["sim-node-2"]["message"]


def test_health_fails_an_absent_fleet_and_says_to_deploy_it(tmp_path):
    """A CI job asks "is the fleet up?": a fleet never deployed must say no, one line per
    host, with what to do."""
    fleet = make_fleet(tmp_path, hosts=2)
    run = run_playbook("playbooks/health.yml", fleet.inventory, fleet.extra)
    assert run.rc == 2 and run.failed_hosts() == {"sim-node-1", "sim-node-2"}
    assert sorted(x for x in run.output.splitlines() if x.startswith("fatal: [")) == [
        f"fatal: [{h}]: FAILED! => {h}: absent: no record of this deployment starting and none "
        f"of its processes is running. Fix: deploy it (sglang-fleet deploy --limit {h}, or "
        f"ansible-playbook deploy.yml --limit {h})" for h in ("sim-node-1", "sim-node-2")]
    proc = sglang_fleet("health", "-i", str(fleet.inventory), "--run-dir", str(tmp_path / "h"),
                        "-e", json.dumps(fleet.extra))
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert ("Fix: deploy it (sglang-fleet deploy --limit sim-node-1,sim-node-2, or "
            "ansible-playbook deploy.yml --limit sim-node-1,sim-node-2)") in proc.stdout
    assert "absent launching" not in proc.stdout and " in launching" not in proc.stdout
    summary = json.loads((tmp_path / "h" / "summary.json").read_text())
    assert {h["verdict"] for h in summary["hosts"].values()} == {"absent"}
    assert junit_cases(tmp_path / "h" / "junit.xml")[("sim-node-1", "health")] is not None
    assert not fleet.root.exists(), "asking is not deploying"


def test_unreachable_hosts_exit_3(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"sglang_servers": {"hosts": {
        "gone-node": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1",
                      "ansible_port": 9, "ansible_ssh_common_args": "-o ConnectTimeout=3"}}}}}}))
    proc = sglang_fleet("health", "-i", str(inventory), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 3, proc.stdout[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["hosts"]["gone-node"]["status"] == "unreachable"
    assert junit_cases(tmp_path / "run" / "junit.xml")[("gone-node", "connect")] is not None


def test_a_secret_inside_overrides_on_the_command_line_is_refused_with_the_fix(fleet):
    pid = fleet.main_pid("sim-node-1")
    run_dir = fleet.root.parent / "runs" / "nested-secret"
    overrides = {"sglang_server_overrides": {"sglang_server_api_key": NESTED_KEY,
                                             "sglang_server_extra_env": {
                                                 "HF_TOKEN": NESTED_TOKEN}}}
    proc = cli(fleet, "deploy", run_dir, "-e", json.dumps(overrides))
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert ("-e sglang_server_overrides.sglang_server_api_key, "
            "sglang_server_overrides.sglang_server_extra_env.HF_TOKEN") in proc.stdout
    assert "Fix: set sglang_server_api_key / sglang_server_hf_token in the inventory" in \
        proc.stdout
    assert "Traceback" not in proc.stdout
    assert not (run_dir / "runner").exists(), "refused before Ansible started"
    assert fleet.main_pid("sim-node-1") == pid


def test_no_secret_in_any_artifact_output_or_log(fleet):
    """Runs after the commands above: every file they left, and everything they printed."""
    roots = [fleet.root.parent / "runs", fleet.root.parent / "evidence"]
    files = [p for r in roots for p in r.rglob("*") if p.is_file()]
    files += [fleet.root.parent / n for n in ("ledger.jsonl", "results.jsonl")]
    files += list(fleet.root.glob("*/logs/*"))
    assert any(p.name == "command" for p in files), "the runner's command record is checked"
    assert_no_secret(files, fleet.outputs, (API_KEY, HF_TOKEN, SHELL_TOKEN, NESTED_KEY,
                                            NESTED_TOKEN))
    # Every record that holds settings is the operator's alone.
    private = [p for r in roots for p in r.rglob("*")] + [fleet.root.parent / "ledger.jsonl"]
    assert any(p.name == "launch_spec.json" for p in private)
    for path in private:
        if path.exists():
            assert path.stat().st_mode & 0o077 == 0, f"{path} is readable by others"
    # The node's env file is where the key must be: 0600, read by the launch script only.
    env_file = next(fleet.root.glob("sim-node-1/conf/*.env"))
    assert API_KEY in env_file.read_text() and env_file.stat().st_mode & 0o777 == 0o600


def assert_no_secret(files, outputs, secrets) -> None:
    for path in files:
        if not path.exists():
            continue
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, f"{secret} found in {path}"
    for output in outputs:
        for secret in secrets:
            assert secret not in output


def test_a_secret_nested_in_the_inventorys_overrides_reaches_no_artifact(tmp_path):
    """The inventory route for the same mistake: whether the LaunchSpec refuses it or not,
    the value must appear in no run record, evidence file, ledger, log or output."""
    nested = make_fleet(tmp_path, hosts=1, time_factor=0.005)
    nested.set_host_vars("sim-node-1", {
        "sglang_server_sim_fault": "hang:loading_weights",
        "sglang_server_overrides": {"sglang_server_api_key": NESTED_KEY,
                                    "sglang_server_extra_env": {"MY_SERVICE_TOKEN": NESTED_TOKEN}}})
    nested.outputs = []
    try:
        proc = cli(nested, "deploy", tmp_path / "runs" / "deploy", "--recover")
        assert proc.returncode in (1, 2), proc.stdout[-3000:]
        files = [p for r in (tmp_path / "runs", tmp_path / "evidence") for p in r.rglob("*")
                 if p.is_file()]
        files += [tmp_path / "ledger.jsonl", *nested.root.glob("*/logs/*"),
                  *nested.root.glob("*/evidence/*/*")]
        assert_no_secret(files, nested.outputs, (NESTED_KEY, NESTED_TOKEN))
        if proc.returncode == 1:  # deployed and recovered: the evidence shows where it was
            (spec_file,) = (tmp_path / "evidence").rglob("launch_spec.json")
            settings = json.loads(spec_file.read_text())["settings"]
            assert settings["sglang_server_overrides"]["sglang_server_api_key"] == "********"
            assert spec_file.stat().st_mode & 0o777 == 0o600
            assert (tmp_path / "ledger.jsonl").stat().st_mode & 0o777 == 0o600
    finally:
        nested.stop()
        nested.kill_leftovers()


# Runs a command and writes its peak memory to argv[1]. A child forked from the test's own
# process starts with that process's resident pages counted in its peak (Linux copies the
# parent's RSS high-water mark at fork), so the command is forked from this small interpreter.
MEASURED = """
import json, os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"maxrss_kb": usage.ru_maxrss}, f)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_broken_inputs_exit_2_with_the_real_error_before_ansible_starts(tmp_path):
    base = REPO / "inventory" / "local"
    bomb = "".join(f"_{c}: &{c} [" + ", ".join([f"*{p}"] * 10) + "]\n"
                   for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    broken = {
        "alias-bomb": ('_a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]\n' + bomb
                       + "sglang_server_extra_args: *i\n").encode(),
        "bad-utf8": b'sglang_server_served_model_name: "Kimi\xff"\n',
        "bad-yaml": b"sglang_server_tp: [8\n",
    }
    expected = {"alias-bomb": "(more than 100,000 added by aliases: an alias bomb?)",
                "bad-utf8": "not valid UTF-8: byte 0xff at line",
                "bad-yaml": "not valid YAML: line"}
    for name, text in broken.items():
        inv = tmp_path / name
        shutil.copytree(base, inv)
        with open(inv / "group_vars" / "sglang_servers.yml", "ab") as f:
            f.write(text)
        started = time.monotonic()
        usage_file = tmp_path / f"usage-{name}.json"
        proc = subprocess.run([sys.executable, "-c", MEASURED, str(usage_file),
                               str(BIN / "sglang-fleet"), "deploy", "-i", str(inv),
                               "--run-dir", str(tmp_path / f"run-{name}")], cwd=REPO,
                              env=ansible_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
        out = proc.stdout.decode()
        seconds = time.monotonic() - started
        usage = json.loads(usage_file.read_text())
        assert proc.returncode == 2, out
        assert f"inventory file {inv}/group_vars/sglang_servers.yml: " in out
        assert expected[name] in out and "Traceback" not in out
        assert not (tmp_path / f"run-{name}" / "runner").exists(), "Ansible never started"
        # Bounded: the CLI's whole run (interpreter start included) and its peak memory.
        assert seconds < 5 and usage["maxrss_kb"] < 200_000, (name, seconds, usage)
    for arg, message in ((b'{"sglang_server_tp": 8', b"not valid YAML: line 1, column 23"),
                         (b"sglang_server_served_model_name=K\xff",
                          b"-e: not valid UTF-8: byte 0xff at position 34")):
        proc = subprocess.run([str(BIN / "sglang-fleet").encode(), b"deploy", b"-e", arg],
                              cwd=REPO, env=ansible_env(), capture_output=True)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert b"Traceback" not in proc.stderr


def test_check_refuses_a_python_tag_and_a_setting_without_bound_with_exit_2(tmp_path):
    """Trials: `check` crashed on a !!python/object tag (exit 4, "stdout missing"), and spent
    672 s and 376 MB on a 200,000-item sglang_server_extra_args, then passed."""
    cases = {
        "python-tag": (b"sglang_server_extra_env: !!python/object/apply:os.getcwd []\n",
                       "sglang_server_extra_env: the YAML tag !!python/object/apply:os.getcwd"),
        "huge-list": (b"sglang_server_extra_args:\n" + b"  - --x\n" * 200_000,
                      "sglang_server_extra_args (line 3) is a list of 200,000 entries, more "
                      "than the 1,000 a setting's list may hold. Fix: give "
                      "sglang_server_extra_args a value of a usable size"),
    }
    for name, (text, expected) in cases.items():
        inv = tmp_path / name
        inv.mkdir()
        (inv / "hosts.yml").write_text(
            "all:\n  children:\n    sglang_servers:\n      hosts:\n        n1:\n")
        (inv / "group_vars").mkdir()
        (inv / "group_vars" / "sglang_servers.yml").write_bytes(b"sglang_server_tp: 8\n" + text)
        usage_file = tmp_path / f"usage-{name}.json"
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", MEASURED, str(usage_file),
                               str(BIN / "sglang-fleet"), "check", "-i", str(inv)], cwd=REPO,
                              env=ansible_env(), capture_output=True, text=True)
        seconds = time.monotonic() - started
        usage = json.loads(usage_file.read_text())
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"inventory file {inv}/group_vars/sglang_servers.yml: " in proc.stderr
        assert expected in " ".join(proc.stderr.split()), proc.stderr
        assert "Traceback" not in proc.stderr + proc.stdout
        assert seconds < 10 and usage["maxrss_kb"] < 300_000, (name, seconds, usage)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_deploy_leaves_no_ansible_process_and_says_what_it_reached(
        tmp_path, signum):
    fleet = make_fleet(tmp_path, hosts=1, time_factor=0.05)  # slow enough to interrupt
    run_dir = tmp_path / "run"
    try:
        cli = CliRun(tmp_path / "out.txt", "deploy", "-i", str(fleet.inventory),
                     "--run-dir", str(run_dir), "-e", json.dumps(fleet.with_stores()))
        wait_for(lambda: cli.gating("sim-node-1"), timeout=180, interval=0.2)
        assert cli.members(), "the run's Ansible processes were found"
        cli.proc.send_signal(signum)
        code = cli.proc.wait(timeout=60)
        text = cli.text()
        assert code == 128 + signum, text[-3000:]
        wait_for(lambda: not cli.members(), timeout=15)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["result"] == "interrupted" and summary["exit_code"] == 128 + signum
        assert summary["interrupted_by"] == signal.Signals(signum).name
        host = summary["hosts"]["sim-node-1"]
        assert host["status"] == "interrupted" and host["verdict"] == "progressing"
        assert host["last_state"].startswith("in health; progressing: ")
        assert f"interrupted by {signal.Signals(signum).name}" in text
        assert "The servers keep starting" in text
        assert "sim-node-1  interrupted  progressing" in text
        assert "Traceback" not in text and "internal error" not in text
        # And they do: the server the run started is still there.
        assert fleet.server_processes("sim-node-1")
    finally:
        fleet.kill_leftovers()


def test_a_sigkilled_cli_takes_its_playbook_run_with_it_and_the_stop_then_works(tmp_path):
    """Trial: after `kill -9` of `sglang-fleet deploy` mid-gate (a CI job cancelled, the OOM
    killer), ansible-playbook was re-parented to PID 1 and hung for more than 14 minutes, its
    worker blocked writing to a pipe, holding the deployment's lock: `stop.yml` refused ("It
    is alive"). The run must end with the CLI; the lock it held is then proven gone."""
    fleet = make_fleet(tmp_path, hosts=1, time_factor=0.05)  # slow enough to be mid-gate
    run: set[tuple[int, int]] = set()  # (pid, start time) of the run's processes
    cli = None
    try:
        cli = CliRun(tmp_path / "out.txt", "deploy", "-i", str(fleet.inventory),
                     "--run-dir", str(tmp_path / "run"), "-e", json.dumps(fleet.with_stores()))
        wait_for(lambda: cli.gating("sim-node-1"), timeout=180, interval=0.2)
        run = cli.identities()
        assert any("ansible-playbook" in p["cmdline"] for p in cli.members())
        cli.proc.kill()
        cli.proc.wait(timeout=10)
        # The run gets SIGTERM from the kernel when the CLI dies, passes it to its workers
        # (10 s is ansible's and the modules' own shutdown, with room for a loaded machine).
        wait_for(lambda: not cli.identities() & run, timeout=60, interval=0.2)
        stop = fleet.stop()
        assert stop.rc == 0, stop.output[-3000:]
        assert "took over the lock of deploy of sim-node-1" in " ".join(stop.output.split())
        assert fleet.server_processes("sim-node-1") == []
    finally:
        # Only the processes of this test's run, if it outlived its CLI (the failure above).
        if cli:
            cli.kill(run, signal.SIGKILL)
        fleet.kill_leftovers()


def server_main_pid(fleet) -> int:
    procs = fleet.server_processes("sim-node-1")
    pids = {p["pid"] for p in procs}
    return next(p["pid"] for p in procs if p["ppid"] not in pids)


def test_watch_recovers_a_server_that_hangs_after_start_and_exports_metrics(tmp_path):
    fleet = make_fleet(tmp_path, hosts=1, time_factor=0.005)
    extra = fleet.with_stores(**FAST_GATE, sglang_server_extra_env={
        "SGLANG_HEALTH_CHECK_TIMEOUT": 1})
    metrics = tmp_path / "textfile" / "sglang_fleet.prom"
    try:
        assert fleet.deploy(extra=extra).rc == 0
        watch = subprocess.Popen(
            [str(BIN / "sglang-fleet"), "watch", "-i", str(fleet.inventory), "--interval", "1",
             "--recover", "--metrics-file", str(metrics), "--run-dir", str(tmp_path / "watch"),
             "-e", json.dumps(extra)],
            cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        try:
            wait_for(lambda: metrics.exists() and
                     'sglang_fleet_server_ready{host="sim-node-1"} 1' in metrics.read_text(),
                     timeout=60)
            hung_pid = server_main_pid(fleet)
            os.kill(hung_pid, signal.SIGUSR1)  # generation hangs from now on
            wait_for(lambda: 'sglang_fleet_watch_recoveries_total{host="sim-node-1"} 1'
                     in metrics.read_text(), timeout=120)
            text = metrics.read_text()
            assert 'sglang_fleet_server_ready{host="sim-node-1"} 1' in text
            assert 'sglang_fleet_server_verdict{host="sim-node-1",verdict="ready"} 1' in text
            assert "# TYPE sglang_fleet_watch_recoveries_total counter" in text
            assert server_main_pid(fleet) != hung_pid
        finally:
            watch.send_signal(signal.SIGTERM)
            out, _ = watch.communicate(timeout=60)
        assert watch.returncode == 0, out[-3000:]
        assert "sim-node-1 unhealthy" in out and "sim-node-1: recovered" in out
        assert "watch stopped by SIGTERM" in out
        # The run folder's contract: the last observation's summary and JUnit file.
        summary = json.loads((tmp_path / "watch" / "summary.json").read_text())
        assert summary["command"] == "watch" and summary["hosts"]["sim-node-1"]["verdict"]
        assert junit_cases(tmp_path / "watch" / "junit.xml")
    finally:
        fleet.kill_leftovers()


def test_an_unset_key_variable_is_refused_with_the_inventorys_own_hint():
    """The example inventory of real nodes reads its API key from the controller's
    SGLANG_API_KEY. Unset, `sglang-fleet check` and `ansible-playbook deploy.yml` say the
    inventory's hint itself (naming the variable and the fix), not ansible-core's chain
    through the role's internals, and count every host refused. Touches no node."""
    env = {k: v for k, v in ansible_env().items() if k != "SGLANG_API_KEY"}
    hint = ("SGLANG_API_KEY is not set on the controller: export it (e.g. `export "
            "SGLANG_API_KEY=$(openssl rand -hex 24)`, kept in your secret store), or set "
            "sglang_server_api_key from ansible-vault")
    hosts = ", ".join(f"gpu-node-{n:02d}" for n in range(1, 9))
    check = subprocess.run([str(BIN / "sglang-fleet"), "check", "-i",
                            "inventory/examples/rtxpro6000-fleet"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 2, check.stdout + check.stderr
    assert check.stdout == (f"refused [{hosts}]:\n    {hint}\nresult: refused (exit 2): 8 of "
                            f"8 hosts have problems; no node was contacted\n"), check.stdout
    deploy = subprocess.run([str(BIN / "ansible-playbook"), "-i",
                             "inventory/examples/rtxpro6000-fleet", "deploy.yml"], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=300)
    assert deploy.returncode != 0
    assert (f"fatal: [{hosts}]: LaunchSpec refused (the same on 8 hosts):\n    {hint}\n"
            in deploy.stdout), deploy.stdout[-3000:]
    assert "Task failed" not in deploy.stdout + check.stdout
    assert "Finalization of task args" not in deploy.stdout + check.stdout


def test_check_and_a_refused_deploy_touch_no_node(tmp_path):
    """`sglang-fleet check` is the deploy's own validation alone, for a pull request's CI step;
    a deploy refused on one host reports every other host as not started, exit 2."""
    fleet = make_fleet(tmp_path, hosts=3)
    extra = json.dumps(fleet.extra)
    ok = sglang_fleet("check", "-i", str(fleet.inventory), "-e", extra)
    assert ok.returncode == 0, ok.stdout
    assert ok.stdout.strip().endswith("result: ok (exit 0): 3 hosts checked; no node was "
                                      "contacted")
    fleet.set_host_vars("sim-node-3", {"sglang_server_extra_args":
                                       ["--tokenizer-worker-num", "0"]})
    bad = sglang_fleet("check", "-i", str(fleet.inventory), "-e", extra)
    assert bad.returncode == 2, bad.stdout
    assert "refused [sim-node-3]:\n    sglang_server_extra_args=['--tokenizer-worker-num', " \
        "'0']: SGLang 0.5.23 refuses the command line in its argument resolution, before any " \
        "worker starts: AssertionError: Tokenizer worker num must >= 1" in bad.stdout
    assert "result: refused (exit 2): 1 of 3 hosts have problems; no node was contacted" in \
        bad.stdout
    run = sglang_fleet("deploy", "-i", str(fleet.inventory), "-e", extra, "--run-dir",
                       str(tmp_path / "run"))
    assert run.returncode == 2, run.stdout[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {h: r["status"] for h, r in summary["hosts"].items()} == {
        "sim-node-1": "not started", "sim-node-2": "not started", "sim-node-3": "failed"}
    assert not fleet.root.exists()
