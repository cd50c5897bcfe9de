"""Rendered launch files: quoting, secrets, systemd unit."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_fleet.launch.render import render_files
from sglang_fleet.launch.spec import build_launch_spec
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
    with open(spec["paths"]["config_file"], "w") as f:
        f.write(files["config"])
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
    # A stand-in for the server's Python: records the server argv it gets and logs its
    # arguments as SGLang 0.5.23 does (`server_args={...}`, values as Python repr); called as
    # the log filter (-u -c CODE VAR) it runs the real interpreter.
    fake = tmp_path / "fakepython"
    logger = ("import sys, yaml; a = sys.argv[1:]; "
              "c = yaml.safe_load(open(a[a.index('--config') + 1])); "
              "print('server_args=' + repr({'model_path': a[a.index('--model-path') + 1], "
              "'api_key': c['api-key'], 'admin_api_key': None}))")
    fake.write_text("#!/bin/bash\n"
                    f'if [ "$1" = "-u" ]; then exec {sys.executable} "$@"; fi\n'
                    f"printf '%s\\n' \"$@\" > {argv_file}\n"
                    f"exec {sys.executable} -c {shlex.quote(logger)} \"$@\"\n")
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
    assert key not in received and "--api-key" not in received, "no key on the command line"
    assert received[received.index("--config") + 1] == spec["paths"]["config_file"]
    import yaml
    config = yaml.safe_load(Path(spec["paths"]["config_file"]).read_text())
    assert config == {"api-key": key}, "the key reaches the server verbatim, from its file"
    assert key not in out and repr(key) not in out, "and never reaches its log"
    assert f"server_args={{'model_path': {evil_path!r}, 'api_key': '********', " in out


def filtered(key, *writes, pause=0.15, env_key=None):
    """What the launch script's log filter makes of `writes`, each a separate write of the
    server, read separately by the filter (the pause lets it read each one on its own)."""
    from sglang_fleet.launch.render import _REDACT
    feeder = ("import os, sys, time\n"
              f"for i, part in enumerate({list(writes)!r}):\n"
              f"    time.sleep({pause} if i else 0)\n"
              "    os.write(1, part)\n")
    env = {"FEED": feeder, "CODE": _REDACT, "K": key if env_key is None else env_key}
    proc = subprocess.run(f"{sys.executable} -c \"$FEED\" | {sys.executable} -u -c \"$CODE\" K",
                          shell=True, capture_output=True, env=env, check=True)
    return proc.stdout


# The lines SGLang prints its key in: 0.5.23 logs a dict, 0.5.4 a ServerArgs dataclass repr.
def args_line_0523(key):
    return ("[2026-03-02 10:00:00] server_args=" + repr(
        {"model_path": "/models/Kimi-K2.5", "api_key": key, "admin_api_key": None,
         "served_model_name": "Kimi-K2.5"}) + "\n").encode()


def args_line_054(key):
    return (f"[2026-03-02 10:00:00] server_args=ServerArgs(model_path='/models/Kimi-K2.5', "
            f"api_key={key!r}, served_model_name='Kimi-K2.5')\n").encode()


def test_log_filter_masks_the_key_where_sglang_prints_it_in_both_formats(tmp_path):
    key = "sk-0123456789abcdef"
    out = filtered(key, args_line_0523(key), args_line_054(key))
    assert key.encode() not in out
    assert b"'api_key': '********', 'admin_api_key': None" in out
    assert b"ServerArgs(model_path='/models/Kimi-K2.5', api_key='********', served" in out
    # A key with quotes is printed as Python's repr, and masked in that form.
    odd = "k'ey\"with\\both"
    out = filtered(odd, args_line_0523(odd))
    assert repr(odd).encode() not in out and b"'api_key': '********'" in out


def test_log_filter_masks_the_ssl_keyfile_password_beside_the_key(tmp_path):
    """--ssl-keyfile-password is a secret SGLang prints in the same arguments line: the
    launch script's filter is given it beside the API key, and masks both, in both formats."""
    from sglang_fleet.launch.render import _REDACT

    key, password = "sk-0123456789abcdef", "pw-fedcba9876543210"
    spec = spec_for(tmp_path, api_key=key, ssl_keyfile_password=password)
    script = render_files(spec, {"SGLANG_FLEET_API_KEY": key,
                                 "SGLANG_FLEET_SSL_KEYFILE_PASSWORD": password})["script"]
    pairs = ["SGLANG_FLEET_API_KEY:api_key",
             "SGLANG_FLEET_SSL_KEYFILE_PASSWORD:ssl_keyfile_password"]
    assert f"{' '.join(pairs)}) 2>&1" in script, script
    line_0523 = ("[2026-03-02 10:00:00] server_args=" + repr(
        {"model_path": "/m", "api_key": key, "ssl_keyfile_password": password,
         "served_model_name": "K"}) + "\n").encode()
    line_054 = (f"[2026-03-02 10:00:00] server_args=ServerArgs(model_path='/m', "
                f"api_key={key!r}, ssl_keyfile_password={password!r}, port=1)\n").encode()
    proc = subprocess.run([sys.executable, "-u", "-c", _REDACT, *pairs],
                          input=line_0523 + line_054, capture_output=True, check=True,
                          env={"SGLANG_FLEET_API_KEY": key,
                               "SGLANG_FLEET_SSL_KEYFILE_PASSWORD": password})
    assert password.encode() not in proc.stdout and key.encode() not in proc.stdout
    assert b"'api_key': '********', 'ssl_keyfile_password': '********', " in proc.stdout
    assert b"api_key='********', ssl_keyfile_password='********', port=1)" in proc.stdout


def test_log_filter_masks_a_key_split_across_reads_and_keeps_redraws(tmp_path):
    key = "sk-0123456789abcdef"
    line = args_line_0523(key)
    start = line.index(b"api_key")
    for cut in (start + 3, start + 11, start + 14, start + 20):  # in the name, in the value
        out = filtered(key, line[:cut], line[cut:] + b"bar 1/2\rbar 2/2\r")
        assert key.encode() not in out, cut
        assert out.endswith(b"'admin_api_key': None, 'served_model_name': 'Kimi-K2.5'}\n"
                            b"bar 1/2\rbar 2/2\r")


def test_a_key_that_is_a_common_word_masks_nothing_else():
    for key in ("ready", "0", "roll"):
        text = (b"[2026-03-02 10:03:12] The server is fired up and ready to roll!\n"
                b"[2026-03-02 10:03:13] Decode batch, #running-req: 0, #token: 100, "
                b"gen throughput (token/s): 10.50, #queue-req: 0\n"
                b"Capturing batches (bs=160 avail_mem=7.80 GB):  35%|###  | 7/20\r")
        out = filtered(key, args_line_0523(key), text)
        assert out == args_line_0523(key).replace(repr(key).encode(), b"'********'") + text


def test_an_empty_key_is_never_masked_between_every_byte():
    text = b"[2026-03-02 10:03:12] The server is fired up and ready to roll!\n"
    out = filtered("", args_line_0523(""), text)
    assert out == (b"sglang-fleet log filter: K is empty; nothing to mask\n"
                   + args_line_0523("") + text)
    assert b"********" not in out


def test_secrets_only_in_the_env_and_config_files(tmp_path):
    spec = spec_for(tmp_path, api_key="sk-live-abc-0123456789", hf_token="hf_xyz")
    secrets = {"SGLANG_FLEET_API_KEY": "sk-live-abc-0123456789", "HF_TOKEN": "hf_xyz"}
    files = render_files(spec, secrets)
    assert "sk-live-abc" not in files["script"] and "hf_xyz" not in files["script"]
    assert "sk-live-abc" not in (files["unit"] or "")
    assert "SGLANG_FLEET_API_KEY=sk-live-abc-0123456789" in files["env"]
    masked = render_files(spec, masked=True)
    assert "sk-live-abc" not in masked["env"] and "********" in masked["env"]
    assert "sk-live-abc" not in masked["config"] and "api-key: '********'" in masked["config"]
    # The command line names the config file, never a secret option.
    assert "--api-key" not in files["script"] and "--api-key" not in spec["argv"]
    assert f"--config {spec['paths']['config_file']}" in files["script"]
    assert spec["argv"][-2:] == ["--config", spec["paths"]["config_file"]]


def test_every_secret_option_is_in_the_config_file_and_none_on_the_command_line(tmp_path):
    """The API key, the admin key, the SSL key's password and the watermark configuration,
    each read back by the simulator's (SGLang 0.5.23's) --config merge with any characters,
    as SGLang parses them; none of them on the rendered command line."""
    import yaml

    from sglang_fleet.sim.args.server_args import prepare_server_args

    values = {"api_key": "~sk-0123456789+/..==", "admin_api_key": "yes",
              "ssl_keyfile_password": "0123456789012345", "watermark_config": "{\"a\": 1}"}
    spec = spec_for(tmp_path, **values)
    env_of = dict(spec["config_options"])
    secrets = {env_of["--" + k.replace("_", "-")]: v for k, v in values.items()}
    files = materialise(tmp_path, spec, secrets)
    assert yaml.safe_load(files["config"]) == {k.replace("_", "-"): v for k, v in values.items()}
    argv = spec["argv"][3:]
    assert not any(v in " ".join(argv) for v in values.values())
    args = prepare_server_args(argv)
    assert {k: getattr(args, k) for k in values} == values
    bare = spec_for(tmp_path / "none")
    empty = render_files(bare, {})
    assert yaml.safe_load(empty["config"]) == {} and "--config" not in bare["argv"]


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


def test_systemd_unit_escapes_spaces_and_specifiers_in_paths(tmp_path):
    """Trial: sglang_server_root "/opt/sglang fleet/50%d" rendered a unit that systemd-analyze
    verify rejected ("Command /opt/sglang is not executable"; %d is a specifier)."""
    root = "/opt/sglang fleet/50%d"
    s = role_defaults()
    s.update(sglang_server_attention_backend="triton", sglang_server_service_manager="systemd",
             sglang_server_root=root, sglang_server_model_path=f"{root}/models/Kimi-K2.5")
    result = build_launch_spec(s, "node1")
    assert result["ok"], result["errors"]
    unit = render_files(result["spec"], {})["unit"]
    deployment = result["spec"]["deployment"]
    lines = unit.splitlines()
    assert "WorkingDirectory=/opt/sglang fleet/50%%d" in lines
    assert f'ExecStart="/opt/sglang fleet/50%%d/conf/{deployment}.launch.sh"' in lines
    assert f"StandardOutput=append:/opt/sglang fleet/50%%d/logs/{deployment}.log" in lines
    assert not [line for line in lines if "%d" in line.replace("%%", "")]


def test_unit_command_paths_are_quoted_only_when_they_must_be():
    from sglang_fleet.launch.render import unit_command_path

    assert unit_command_path("/opt/sglang-fleet/conf/K-30000.launch.sh") == \
        "/opt/sglang-fleet/conf/K-30000.launch.sh"
    assert unit_command_path("/a b/x") == '"/a b/x"'
    # systemd takes a `$` in the program's path literally: doubling it names another file.
    assert unit_command_path("/a/$X%n") == "/a/$X%%n"
    assert unit_command_path("/a b/$X;y") == '"/a b/$X;y"'


@pytest.mark.parametrize("root", ["/opt/a$b", "/opt/a b$c;d", "/opt/sglang-fleet"])
def test_a_root_with_dollar_or_semicolon_renders_a_unit_systemd_can_start(tmp_path, root):
    """Trial: a root with `$` rendered ExecStart=.../a$$b/..., which systemd does not undouble
    in a program's path: the unit failed at start ("is not executable")."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    s = role_defaults()
    s.update(sglang_server_attention_backend="triton", sglang_server_service_manager="systemd",
             sglang_server_root=str(tmp_path) + root,
             sglang_server_model_path="/models/Kimi-K2.5")
    result = build_launch_spec(s, "node1")
    assert result["ok"], result["errors"]
    paths = result["spec"]["paths"]
    script = Path(paths["script"])
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    Path(paths["log_file"]).parent.mkdir(parents=True)
    unit = tmp_path / "sglang-trial.service"
    unit.write_text(render_files(result["spec"], {})["unit"])
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                            text=True, timeout=60)
    said = [line for line in verify.stderr.splitlines() if "sglang-trial" in line]
    assert said == [], said


@pytest.mark.parametrize("root", ['/opt/a"b', "/opt/a'b", "/opt/a\\b"])
def test_a_root_systemd_cannot_run_is_refused_naming_the_variable(root):
    s = role_defaults()
    s.update(sglang_server_attention_backend="triton", sglang_server_service_manager="systemd",
             sglang_server_root=root)
    result = build_launch_spec(s, "node1")
    assert not result["ok"]
    (error,) = result["errors"]
    assert error.startswith(f"host node1: sglang_server_root={root!r}: holds ")
    assert "which systemd refuses in the path of the program a unit runs" in error
    assert "Fix: choose a root without quotes or backslashes" in error
    # Under supervisor there is no unit: the root is fine.
    s.update(sglang_server_service_manager="supervisor")
    assert build_launch_spec(s, "node1")["ok"]
