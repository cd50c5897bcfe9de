"""`sglang-fleet render` through ansible-runner, against golden files per inventory.

Regenerate after an intended change with UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from sglang_fleet.testfleet.local import BIN, REPO

GOLDEN = REPO / "tests" / "fixtures" / "golden"
CASES = [
    ("inventory/local", "sim-node-1"),
    ("inventory/examples/rtxpro6000-fleet", "gpu-node-01"),
    ("inventory/examples/tp16-two-nodes", "gpu-a01"),
    ("inventory/examples/tp16-two-nodes", "gpu-a02"),
    ("inventory/examples/pd-deepseek-v3", "gpu-p01"),
    ("inventory/examples/pd-deepseek-v3", "gpu-d01"),
]


def normalise(text: str) -> str:
    # The local fleet's paths (and so its hash) depend on where the checkout lives.
    # The interpreter first (its path contains the repo's): python or python3, by venv.
    text = re.sub(re.escape(str(BIN)) + r"/python3?\b", "<python>", text)
    text = text.replace(sys.executable, "<python>").replace(str(REPO), "<repo>")
    # The hash appears under its name and bare (the run separator): replace every occurrence.
    for chash in set(re.findall(r"(?:config |configuration |SGLANG_FLEET_CONFIG=)([0-9a-f]{12})",
                                text)):
        text = text.replace(chash, "<hash>")
    return text


@pytest.mark.parametrize("inventory,host", CASES, ids=[f"{i.split('/')[-1]}-{h}"
                                                       for i, h in CASES])
def test_render_matches_golden(inventory, host):
    env = dict(os.environ, SGLANG_API_KEY="sk-example-must-not-appear")
    proc = subprocess.run([str(BIN / "sglang-fleet"), "render", "-i", inventory, host],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "sk-example-must-not-appear" not in proc.stdout
    text = normalise(proc.stdout)
    golden = GOLDEN / f"{inventory.split('/')[-1]}-{host}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


def test_render_reports_validation_errors_with_exit_2(tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  children:\n    sglang_servers:\n      hosts:\n        n1:\n"
                   "          sglang_server_tp: 99\n")
    proc = subprocess.run([str(BIN / "sglang-fleet"), "render", "-i", str(inv), "n1"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "host n1: sglang_server_tp=99" in proc.stderr


def test_render_shows_what_a_deploy_with_extra_vars_and_a_limit_would_write():
    """`render` takes -e and --limit as deploy does: an NCCL override lands in the env file
    (and so in the configuration's hash); --limit renders each host it selects."""
    def render(*args: str) -> str:
        proc = subprocess.run([str(BIN / "sglang-fleet"), "render", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    plain = render("sim-node-1")
    tuned = render("sim-node-1", "-e", '{"sglang_server_nccl_profile": {"NCCL_PROTO": "Simple"}}')
    env = tuned.split(".env (mode 0600, secrets masked)\n", 1)[1]
    assert "\nNCCL_PROTO=Simple\n" in env and "NCCL_PROTO" not in plain
    assert tuned.splitlines()[0] != plain.splitlines()[0]  # another configuration hash
    heads = [line.split(":")[0] for line in render("--limit", "sim-node-1,sim-node-3")
             .splitlines() if re.match(r"# sim-node-\d+: deployment ", line)]
    assert heads == ["# sim-node-1", "# sim-node-3"]
