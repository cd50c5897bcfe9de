"""The runner's artifacts are masked by name (one rule for every name) and by value: a secret in
an environment variable of any name, once the run used it as a secret, is masked in every file
of the run, wherever it appears."""

from __future__ import annotations

import json

from sglang_fleet.node.common.secrets import fingerprint, is_secret_name
from sglang_fleet.runs.runner import scrub_artifacts, secret_values

BEARER = "bearer-value-0123456789"
PASSPHRASE = "correct horse battery staple"
RKEY = "rk-value-abcdef012345"
UNNAMED = "sk-unnamed-9f8e7d6c5b4a"  # read by the inventory from SGL_CRED_VAR_2: a plain name
SECRETS = (BEARER, PASSPHRASE, RKEY, UNNAMED)


def test_one_rule_names_secrets_of_any_spelling():
    for name in ("SGL_BEARER", "MY_PASSPHRASE", "RKEY", "ADMIN_KEY", "api_key", "key",
                 "db_password", "hf_token", "MY_SERVICE_TOKEN", "GITHUB_AUTH", "apikey",
                 "control_plane_api_keys", "sglang_server_api_key", "AWS_SECRET_ACCESS_KEY",
                 "password_file_contents"):
        assert is_secret_name(name), name
    # SGLang's own names that hold counts and switches stay readable (and usable in extra_env).
    for name in ("tokenizer_path", "max_tokens", "secret_env_names", "PATH", "HOME",
                 "monkeypatch_level", "keyfile", "ssl_keyfile", "PWD", "auth_level",
                 "SGLANG_INIT_NEW_TOKEN_RATIO", "SGLANG_USE_AITER_FP8_PER_TOKEN",
                 "bucket_time_to_first_token", "speculative_token_map"):
        assert not is_secret_name(name), name


def test_extra_env_refuses_secret_names_by_the_same_rule():
    from sglang_fleet.launch.spec import build_launch_spec
    from sglang_fleet.testfleet.local import role_defaults

    def errors(env):
        values = dict(role_defaults(), sglang_server_attention_backend="triton",
                      sglang_server_extra_env=env)
        return "\n".join(build_launch_spec(values, "n1")["errors"])

    assert "looks like a secret" in errors({"SGL_BEARER": "x"})
    assert "looks like a secret" in errors({"RKEY": "x"})
    assert errors({"SGLANG_INIT_NEW_TOKEN_RATIO": "0.7"}) == ""


def make_run(tmp_path):
    root = tmp_path / "pdd"
    events = root / "artifacts" / "id1" / "job_events"
    events.mkdir(parents=True)
    (root / "env").mkdir()
    (root / "env" / "extravars").write_text(json.dumps({"sglang_fleet_run_dir": "/tmp/r"}))
    env = {"SGL_BEARER": BEARER, "MY_PASSPHRASE": PASSPHRASE, "RKEY": RKEY,
           "SGL_CRED_VAR_2": UNNAMED, "PATH": "/usr/bin:/bin", "SHORT_TOKEN": "1",
           "OTHER": "a-value-the-run-never-used-as-secret"}
    (root / "artifacts" / "id1" / "command").write_text(json.dumps(
        {"command": ["ansible-playbook", "-i", "hosts"], "cwd": "/x", "env": env}))
    # The run recorded the unnamed variable's value as a secret (a LaunchSpec's fingerprint),
    # and a task echoed it (a mistake the scrub must still catch).
    (events / "1-a.json").write_text(json.dumps({"event_data": {"res": {
        "secret_fingerprints": {"SGLANG_FLEET_API_KEY": fingerprint(UNNAMED)},
        "msg": f"connected with {UNNAMED} and {json.dumps(PASSPHRASE)}"}}}))
    (root / "artifacts" / "id1" / "stdout").write_text(f"ok {RKEY} {BEARER}\n1 host\n")
    return root


def test_every_secret_value_is_masked_in_every_file_of_the_run(tmp_path):
    root = make_run(tmp_path)
    assert secret_values(root) == set(SECRETS)
    scrub_artifacts(str(root))
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_text()
            for secret in SECRETS:
                assert secret not in data, (secret, path)
            assert path.stat().st_mode & 0o077 == 0
    record = json.loads((root / "artifacts" / "id1" / "command").read_text())
    assert record["env"]["SGL_CRED_VAR_2"] == "********"
    # What is not a secret stays readable, and a short value masks nothing else.
    assert record["env"]["PATH"] == "/usr/bin:/bin"
    assert record["env"]["OTHER"] == "a-value-the-run-never-used-as-secret"
    assert (root / "artifacts" / "id1" / "stdout").read_text() == "ok ******** ********\n1 host\n"
