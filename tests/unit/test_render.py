"""Rendered launch files: quoting, secrets, systemd unit."""

from __future__ import annotations

import os
import subprocess

from helpers import role_defaults
from sglang_fleet.render import render_files
from sglang_fleet.spec import build_launch_spec


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


def test_shell_metacharacters_stay_arguments(tmp_path):
    pwned = tmp_path / "pwned"
    evil_path = f"x; touch {pwned}"
    spec = spec_for(tmp_path, install_mode="existing", python="/bin/echo", deployment_name="evil",
                    model_path=evil_path, served_model_name="$(touch " + str(pwned) + ")",
                    extra_args=["--log-level", "`touch " + str(pwned) + "`"],
                    extra_env={"SGLANG_NOTE": "'; touch " + str(pwned) + " #"},
                    api_key="k'ey\"$(touch " + str(pwned) + ")")
    secrets = {"SGLANG_FLEET_API_KEY": "k'ey\"$(touch " + str(pwned) + ")"}
    materialise(tmp_path, spec, secrets)
    # The script execs /bin/echo with the server's argv: run it for real.
    out = subprocess.run([spec["paths"]["script"]], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"}).stdout
    assert not pwned.exists()
    assert evil_path in out
    assert secrets["SGLANG_FLEET_API_KEY"] in out  # expanded at exec time, verbatim


def test_secrets_only_in_the_env_file(tmp_path):
    spec = spec_for(tmp_path, api_key="sk-live-abc", hf_token="hf_xyz")
    secrets = {"SGLANG_FLEET_API_KEY": "sk-live-abc", "HF_TOKEN": "hf_xyz"}
    files = render_files(spec, secrets)
    assert "sk-live-abc" not in files["script"] and "hf_xyz" not in files["script"]
    assert "sk-live-abc" not in (files["unit"] or "")
    assert "SGLANG_FLEET_API_KEY=sk-live-abc" in files["env"]
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
