"""Rendered launch files: quoting, secrets, systemd unit."""

from __future__ import annotations

import os
import subprocess
import sys

from sglang_fleet.render import render_files
from sglang_fleet.spec import build_launch_spec
from sglang_fleet.testfleet.local import role_defaults


def spec_for(tmp_path, **overrides):
    s = role_defaults()
    s.update({"sglang_server_" + k: v for k, v in overrides.items()})
    s.setdefault("sglang_server_attention_backend", "triton")
    s["sglang_server_root"] = str(tmp_path)
    result = build_launch_spec(s, "node1")
    assert result["ok"], result["errors"]
    return result["spec"]


def materialise(tmp_path, spec, secrets):
    files = render_files(spec, secrets)
    os.makedirs(spec["paths"]["conf_dir"], exist_ok=True)
    with open(spec["paths"]["env_file"], "w") as f:
        f.write(files["env"])
    with open(spec["paths"]["script"], "w") as f:
        f.write(files["script"])
    os.chmod(spec["paths"]["script"], 0o755)
    return files


def test_script_is_strict_and_execs_the_server(tmp_path):
    files = render_files(spec_for(tmp_path), {})
    script = files["script"]
    assert script.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in script
    assert "\nexec /" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_shell_metacharacters_stay_arguments_and_the_key_is_filtered(tmp_path):
    pwned = tmp_path / "pwned"
    argv_file = tmp_path / "argv"
    # A stand-in for the server's Python: records the server argv it gets and prints it;
    # called as the log filter (-u -c CODE VAR) it runs the real interpreter.
    fake = tmp_path / "fakepython"
    fake.write_text("#!/bin/bash\n"
                    f'if [ "$1" = "-u" ]; then exec {sys.executable} "$@"; fi\n'
                    f"printf '%s\\n' \"$@\" > {argv_file}\n"
                    "printf '%s\\n' \"$@\"\n")
    fake.chmod(0o755)
    evil_path = f"x; touch {pwned}"
    # Validation refuses such a key; the rendering must still quote whatever it is given.
    key = "k'ey\"$(touch " + str(pwned) + ")"
    spec = spec_for(tmp_path, install_mode="existing", python=str(fake),
                    deployment_name="evil", model_path=evil_path,
                    served_model_name="$(touch " + str(pwned) + ")",
                    extra_args=["--log-level", "`touch " + str(pwned) + "`"],
                    extra_env={"SGLANG_NOTE": "'; touch " + str(pwned) + " #"},
                    api_key="a-valid-key-0123456789")
    materialise(tmp_path, spec, {"SGLANG_FLEET_API_KEY": key})
    out = subprocess.run([spec["paths"]["script"]], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"}).stdout
    assert not pwned.exists()
    received = argv_file.read_text().splitlines()
    assert evil_path in received
    assert key in received, "the key reaches the server verbatim, expanded at exec time"
    assert key not in out and "--api-key\n********" in out, "and never reaches its log"


def test_log_filter_masks_a_key_split_across_reads_and_keeps_redraws(tmp_path):
    from sglang_fleet.render import _REDACT
    key = "sk-0123456789abcdef"
    feeder = ("import os, sys, time\n"
              f"os.write(1, b'a {key[:7]}'); time.sleep(0.2)\n"
              f"os.write(1, b'{key[7:]} b\\rbar 1/2\\rbar 2/2\\n')\n")
    proc = subprocess.run(f"{sys.executable} -c \"$FEED\" | {sys.executable} -u -c \"$CODE\" K",
                          shell=True, capture_output=True,
                          env={"FEED": feeder, "CODE": _REDACT, "K": key})
    assert proc.stdout == b"a ******** b\rbar 1/2\rbar 2/2\n"


def test_secrets_only_in_the_env_file(tmp_path):
    spec = spec_for(tmp_path, api_key="sk-live-abc-0123456789", hf_token="hf_xyz")
    secrets = {"SGLANG_FLEET_API_KEY": "sk-live-abc-0123456789", "HF_TOKEN": "hf_xyz"}
    files = render_files(spec, secrets)
    assert "sk-live-abc" not in files["script"] and "hf_xyz" not in files["script"]
    assert "sk-live-abc" not in (files["unit"] or "")
    assert "SGLANG_FLEET_API_KEY=sk-live-abc-0123456789" in files["env"]
    masked = render_files(spec, masked=True)
    assert "sk-live-abc" not in masked["env"] and "********" in masked["env"]
    assert '--api-key "${SGLANG_FLEET_API_KEY}"' in files["script"]


def test_systemd_unit_is_a_kill_boundary_without_restart_loop(tmp_path):
    unit = render_files(spec_for(tmp_path), {})["unit"]
    assert "KillMode=control-group" in unit
    assert "Restart=no" in unit
    assert "TimeoutStopSec=60" in unit
    assert "StandardOutput=append:" in unit


def test_supervisor_deployments_render_no_unit(tmp_path):
    assert render_files(spec_for(tmp_path, service_manager="supervisor"), {})["unit"] is None


def test_a_secret_that_resolves_empty_is_refused_before_any_file_is_written(tmp_path):
    import pytest

    spec = spec_for(tmp_path, api_key="a-valid-key-0123456789")
    with pytest.raises(ValueError, match="resolve empty"):
        render_files(spec, {"SGLANG_FLEET_API_KEY": ""})
    # And the script itself refuses to start a server with an empty key.
    materialise(tmp_path, spec, {"SGLANG_FLEET_API_KEY": "a-valid-key-0123456789"})
    env_file = spec["paths"]["env_file"]
    with open(env_file) as f:
        text = f.read().replace("=a-valid-key-0123456789", "=''")
    with open(env_file, "w") as f:
        f.write(text)
    proc = subprocess.run([spec["paths"]["script"]], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode != 0
    assert "SGLANG_FLEET_API_KEY: is empty: refusing to start" in proc.stderr
