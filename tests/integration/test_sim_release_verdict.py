"""A simulated server refuses what its release refuses, by the release's own verdict: command
lines the real 0.5.23 refuses after its parser, which the simulator's own copies of SGLang's
checks accept, are judged once by the release's pipeline on the controller (as a deploy does;
cached verdicts are reused), then started as simulated servers directly, bypassing the
controller's refusal. Each exits 1 with SGLang's own final line and the frame that raised it,
before any worker starts. Without a verdict the simulator says so and runs its own checks.
"""

from __future__ import annotations

import json
import re

import pytest

from sglang_fleet.known import release_check
from sglang_fleet.known.catalogue import catalogue
from sglang_fleet.known.models import gpu_memory_bytes
from sglang_fleet.known.sglang_checks import refusals
from sglang_fleet.sim.launch_server import ENTRYPOINT_WARNING
from sglang_fleet.testfleet.local import make_fleet, sglang_fleet, start_sim, wait_for

pytestmark = pytest.mark.integration

VERSION = "0.5.23"
BASE = ["--model-path", "/models/Kimi-K2.5", "--served-model-name", "Kimi-K2.5",
        "--tp-size", "8", "--port", "30000"]
# (the line's own flags, part of SGLang's final line)
LINES = [
    (["--page-size", "3", "--chunked-prefill-size", "8192"],
     "chunked_prefill_size must be divisible by page_size"),
    (["--ssl-keyfile", "/etc/sglang/tls.key"], "--ssl-keyfile requires --ssl-certfile"),
    (["--schedule-conservativeness", "-1"], "schedule_conservativeness must be non-negative"),
]


def config_hash(i: int) -> str:
    return f"test-sim-verdict-{i}"


@pytest.fixture(scope="module")
def verdicts():
    """The release's verdict on each line, as the deploy's check judges a simulated server's
    (in the shared release cache: one run of 0.5.23's environment the first time only)."""
    model = release_check.model_config("Kimi-K2.5")
    cases = {str(i): {**release_check.case_of(VERSION, BASE + flags, model, {},
                                              gpu_memory_bytes("RTX PRO 6000 Blackwell"),
                                              "12.0"), "sim_config": config_hash(i)}
             for i, (flags, _) in enumerate(LINES)}
    return release_check.judge(cases)


@pytest.mark.parametrize("i", range(len(LINES)), ids=[flags[0] for flags, _ in LINES])
def test_a_simulated_server_exits_with_the_releases_own_refusal(verdicts, tmp_path, i):
    flags, reason = LINES[i]
    verdict = verdicts[str(i)]
    assert not verdict["ok"] and reason in verdict["error"][0], verdict
    parsed = vars(catalogue(VERSION).parse(BASE + flags))
    assert refusals(VERSION, parsed) == [], "the simulator's own checks refuse it already"
    sim = start_sim(tmp_path, "--tp-size", "8", *flags,
                    env={"SGLANG_FLEET_CONFIG": config_hash(i)})
    try:
        assert sim.proc.wait(timeout=60) == 1
    finally:
        sim.stop()
    log = sim.log()
    raised = verdict["raised_at"]
    assert raised["file"].startswith("sglang/srt/"), raised
    # SGLang's traceback: the frame that raised (file, line, function, statement), then its
    # final line, as the last lines the process wrote; no worker started.
    assert log.endswith(f'/{raised["file"]}", line {raised["line"]}, in {raised["function"]}\n'
                        f'    {raised["code"]}\n{verdict["error"][0]}\n'), log[-1500:]
    assert ENTRYPOINT_WARNING.splitlines()[0] in log
    assert "server_args=" not in log and "No verdict" not in log


def test_without_a_verdict_the_simulator_says_so_and_runs_its_own_checks(verdicts, tmp_path):
    flags, _ = LINES[0]
    sim = start_sim(tmp_path, "--tp-size", "8", *flags, env={"SGLANG_FLEET_CONFIG": ""})
    try:
        wait_for(lambda: "server_args=" in sim.log() or sim.proc.poll() is not None, 60)
        log = sim.log()
        assert sim.proc.poll() is None, log[-1500:]
    finally:
        sim.stop()
    said = [x for x in log.splitlines() if "No verdict of SGLang" in x]
    assert len(said) == 1 and "no configuration hash (SGLANG_FLEET_CONFIG)" in said[0], said


def test_the_controller_records_the_verdict_a_deployed_simulated_server_reads(tmp_path):
    """What a deploy renders is judged by the release, and the verdict is found by the
    configuration hash the server's env file carries (SGLANG_FLEET_CONFIG)."""
    fleet = make_fleet(tmp_path, hosts=1)
    host = fleet.hosts[0]
    proc = sglang_fleet("render", "-i", str(fleet.inventory), "-e", json.dumps(fleet.extra),
                        host)
    assert proc.returncode == 0, proc.stdout[-3000:]
    config = re.search(r"^SGLANG_FLEET_CONFIG=([0-9a-f]+)$", proc.stdout, re.M).group(1)
    verdict, missing = release_check.config_verdict(VERSION, config)
    assert missing == "" and verdict == {"ok": True, "error": None, "raised_at": None,
                                         "parse_only": False}, (missing, verdict)
    assert not fleet.root.exists(), "rendering touched the node"
