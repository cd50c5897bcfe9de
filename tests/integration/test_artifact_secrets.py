"""No secret in any ansible-runner artifact: through the CLI, whatever the environment variables
holding the keys are called (masked by value, not only by name); and under plain
`ansible-runner run`, as AWX runs a job, with the settings docs/cli.md documents (secrets from
ansible-vault, none exported in the runner's environment)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import ansible_runner
import pytest

from sglang_fleet.testfleet.local import BIN, FAST_GATE, REPO, ansible_env, make_fleet

pytestmark = pytest.mark.integration

# The server's key, read by the inventory from a variable whose name says nothing.
PLAIN_VAR = "SGL_CRED_VAR_2"
KEY = "sk-plainvar-5c2e8a1f9b7d3e40"
# An operator's own secrets in the environment, under names only a broad rule catches.
OTHERS = {"SGL_BEARER": "bearer-6f1d2c3b4a5e6f70", "MY_PASSPHRASE": "pass-phrase-of-mine-11",
          "RKEY": "rkey-0a1b2c3d4e5f6a7b"}
VAULT_KEY = "sk-vaulted-3b9d7f1e5a2c4d68"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("artifacts")
    fleet = make_fleet(tmp, hosts=1, time_factor=0.005)
    fleet.tmp = tmp
    try:
        yield fleet
    finally:
        fleet.kill_leftovers()


def files_holding(root: Path, secrets) -> list[tuple[str, str]]:
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [(secret, str(path)) for secret in secrets if secret.encode() in data]
    return found


def test_the_cli_masks_a_key_by_value_whatever_its_variable_is_called(fleet):
    fleet.update_group_vars("sglang_servers", {
        "sglang_server_api_key": "{{ lookup('ansible.builtin.env', '" + PLAIN_VAR + "') }}"})
    run_dir = fleet.tmp / "runs" / "deploy"
    env = dict(ansible_env(), **OTHERS, **{PLAIN_VAR: KEY})
    proc = subprocess.run(
        [str(BIN / "sglang-fleet"), "deploy", "-i", str(fleet.inventory), "--run-dir",
         str(run_dir), "-e", json.dumps(fleet.with_stores(**FAST_GATE))],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    (command,) = run_dir.glob("runner/artifacts/*/command")
    recorded = json.loads(command.read_text())["env"]
    assert recorded[PLAIN_VAR] == "********", "masked by value: the run used it as a secret"
    assert all(recorded[name] == "********" for name in OTHERS), "masked by name"
    assert files_holding(run_dir, [KEY, *OTHERS.values()]) == []
    assert KEY not in proc.stdout


def test_plain_ansible_runner_with_vaulted_keys_keeps_no_secret_in_its_artifacts(fleet, tmp_path):
    """The documented settings: keys from ansible-vault (AWX: a Vault credential), the vault's
    password as a file runner's command line names, nothing secret exported to the runner."""
    password = tmp_path / "vault-pass"
    password.write_text("vault-password-for-test\n")
    password.chmod(0o600)
    encrypted = subprocess.run(
        [str(BIN / "ansible-vault"), "encrypt_string", "--vault-password-file", str(password),
         VAULT_KEY, "--name", "sglang_server_api_key"],
        capture_output=True, text=True, check=True, env=ansible_env()).stdout
    group_vars = fleet.inventory / "group_vars" / "sglang_servers.yml"
    text = "\n".join(line for line in group_vars.read_text().splitlines()
                     if not line.startswith("sglang_server_api_key:"))
    group_vars.write_text(text + "\n" + encrypted)
    pdd = tmp_path / "pdd"
    pdd.mkdir()
    envvars = {"ANSIBLE_STDOUT_CALLBACK": "sglang.fleet.sglang_fleet", "ANSIBLE_NOCOLOR": "1",
               "PATH": f"{BIN}:/usr/bin:/bin"}
    run = ansible_runner.run(private_data_dir=str(pdd), project_dir=str(REPO),
                             playbook="deploy.yml", inventory=str(fleet.inventory),
                             extravars=fleet.with_stores(**FAST_GATE), envvars=envvars,
                             cmdline=f"--vault-password-file {password}", quiet=True)
    assert run.rc == 0, run.stdout.read()[-3000:]
    assert files_holding(pdd, [VAULT_KEY, "vault-password-for-test"]) == []
    # The server did get the key: it answers with it, and without it refuses.
    import requests
    url = fleet.url("sim-node-1") + "/v1/models"
    assert requests.get(url, timeout=10).status_code == 401
    assert requests.get(url, timeout=10,
                        headers={"Authorization": f"Bearer {VAULT_KEY}"}).status_code == 200
