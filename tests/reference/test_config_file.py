"""`--config FILE` as SGLang 0.5.23 reads it: the simulator's merge
(sglang_fleet.sim.args.config_file) gives the same values and the same errors as the real
prepare_server_args, for the file the deploy renders (the secret options under their dashed
spellings) and
for the cases around it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sglang_fleet.reference import refenv

VERSION = "0.5.23"
FIELDS = ("api_key", "admin_api_key", "ssl_keyfile_password", "tp_size", "enable_metrics",
          "log_level", "json_model_override_args", "numa_node", "disable_cuda_graph")

# name: (file name, YAML text or None for no file, argv after --model-path /m)
CASES = {
    "secrets": ("c.yaml", "api-key: sk-0123456789abcdef\nadmin-api-key: ak-x\n"
                          "ssl-keyfile-password: '0123'\n", ["--config", "{path}"]),
    "underscored key": ("c.yaml", "api_key: k\n", ["--config", "{path}"]),
    "command line wins": ("c.yaml", "api-key: from-file\n",
                          ["--config", "{path}", "--api-key", "from-cli"]),
    "switch on": ("c.yml", "enable-metrics: true\n", ["--config", "{path}"]),
    "switch off": ("c.yml", "enable-metrics: false\n", ["--config", "{path}"]),
    "alias and value": ("c.yaml", "tp: 2\nlog-level: warning\n", ["--config", "{path}"]),
    "mapping as json": ("c.yaml", "json-model-override-args: {a: 1}\n", ["--config", "{path}"]),
    "list": ("c.yaml", "numa-node: [0, 1]\n", ["--config", "{path}"]),
    "boolean optional": ("c.yaml", "enable-tf32-matmul: true\n", ["--config", "{path}"]),
    "deprecated switch": ("c.yaml", "disable-cuda-graph: true\n", ["--config", "{path}"]),
    "empty file": ("c.yaml", "", ["--config", "{path}"]),
    "root a list": ("c.yaml", "- a\n", ["--config", "{path}"]),
    "not yaml suffix": ("c.json", "{}", ["--config", "{path}"]),
    "missing file": ("c.yaml", None, ["--config", "{path}"]),
    "two files": ("c.yaml", "{}", ["--config", "{path}", "--config", "{path}"]),
    "no path": ("c.yaml", "{}", ["--config"]),
    "equals form ignored": ("c.yaml", "api-key: k\n", ["--config={path}"]),
    "bad yaml": ("c.yaml", "a: [1\n", ["--config", "{path}"]),
}

SCRIPT = r"""
import contextlib, io, json, sys
mod, fn, fields = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
prepare = getattr(__import__(mod, fromlist=[fn]), fn)
out = {}
for name, argv in json.loads(sys.stdin.read()).items():
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = prepare(["--model-path", "/m", *argv])
        out[name] = {"values": {f: getattr(args, f, None) for f in fields}}
    except SystemExit as exc:
        lines = err.getvalue().strip().splitlines()
        out[name] = {"exit": exc.code, "error": lines[-1] if lines else ""}
    except Exception as exc:
        out[name] = {"raised": type(exc).__name__,
                     "error": str(exc) if isinstance(exc, ValueError) else ""}
print(json.dumps(out, default=str))
"""


def argv_of(tmp_path: Path) -> dict[str, list[str]]:
    out = {}
    for name, (file_name, text, argv) in CASES.items():
        folder = tmp_path / name.replace(" ", "-")
        folder.mkdir()
        path = folder / file_name
        if text is not None:
            path.write_text(text)
        out[name] = [a.replace("{path}", str(path)) for a in argv]
    return out


def test_the_simulator_reads_a_config_file_as_sglang_does(tmp_path):
    env = refenv.ensure(VERSION, quiet=True)
    cases = json.dumps(argv_of(tmp_path))
    real = env.run("-c", SCRIPT, "sglang.srt.server_args", "prepare_server_args",
                   ",".join(FIELDS), stdin=cases)
    assert real.returncode == 0, real.stderr[-2000:]
    sim = subprocess.run([sys.executable, "-c", SCRIPT, "sglang_fleet.sim.args.server_args",
                          "prepare_server_args", ",".join(FIELDS)], input=cases,
                         capture_output=True, text=True, timeout=120,
                         env={"SGLANG_SIM_VERSION": VERSION, "PATH": "/usr/bin:/bin"})
    assert sim.returncode == 0, sim.stderr[-2000:]
    expected, got = json.loads(real.stdout.strip().splitlines()[-1]), json.loads(
        sim.stdout.strip().splitlines()[-1])
    # The cases mean something: values read, flags refused, files refused.
    assert expected["secrets"]["values"]["api_key"] == "sk-0123456789abcdef"
    assert expected["command line wins"]["values"]["api_key"] == "from-cli"
    assert expected["underscored key"]["exit"] == 2
    assert expected["equals form ignored"]["values"]["api_key"] is None
    for name in CASES:
        assert got[name] == expected[name], name
