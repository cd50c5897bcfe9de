"""Render a LaunchSpec into the files a node runs: launch script, env file and config file
(both 0600), systemd unit."""

from __future__ import annotations

import shlex
from typing import Any

import yaml

from sglang_fleet.settings.server import SETTINGS

# Each secret option and the name SGLang logs its value under (its argparse destination).
SECRET_FIELDS = {s.flag: s.flag.lstrip("-").replace("-", "_")
                 for s in SETTINGS if s.secret and s.flag}

MASK = "********"
HEADER = "# Managed by sglang-fleet: changes here are overwritten by the next deploy."

# SGLang logs its arguments, secrets included (0.5.23 redacts only watermark keys), in exactly
# one place: the engine's `server_args=` line, as Python's repr of each value. 0.5.23 logs a
# dict (`'api_key': 'K'`), 0.5.4 a dataclass (`ServerArgs(..., api_key='K', ...)`). This filter
# sits between the server and the log and masks each secret option's value there only (its
# arguments: ENV_VARIABLE:field pairs), so a key that is also a common word (`ready`, `0`) never
# blanks other text. It streams: it holds back only a tail that could begin such a field split
# across reads, keeps carriage returns (tqdm redraws), and copies the log through unchanged
# where a secret is empty.
_REDACT = r"""import os, sys
masked = b"'********'"
fields = []
for pair in sys.argv[1:]:
    name, _, field = pair.partition(":")
    key = os.environ.get(name, "")
    if not key:
        os.write(1, ("sglang-fleet log filter: %s is empty; nothing to mask\n" % name).encode())
        continue
    value = repr(key).encode("utf-8", "backslashreplace")
    fields += [(anchor + value, anchor + masked)
               for anchor in (field.encode() + b"': ", field.encode() + b"=")]
longest = max([len(f) for f, _ in fields] or [1])


def out(data):
    while data:
        data = data[os.write(1, data):]


pending = b""
while True:
    chunk = os.read(0, 65536)
    data = pending + chunk
    pending = b""
    for field, replacement in fields:
        data = data.replace(field, replacement)
    for n in range(min(longest - 1, len(data)), 0, -1) if chunk and fields else ():
        if any(field.startswith(data[-n:]) for field, _ in fields):
            data, pending = data[:-n], data[-n:]
            break
    out(data)
    if not chunk:
        break
"""

def launch_script(spec: dict[str, Any]) -> str:
    paths = spec["paths"]
    # One line per flag with its value(s), so a reviewer reads the command as SGLang sees it.
    lines_of_argv: list[str] = []
    for item in spec["argv"]:
        word = shlex.quote(str(item))
        starts_flag = isinstance(item, str) and item.startswith("--")
        if lines_of_argv and not starts_flag and (len(lines_of_argv) == 1 or
                                                  lines_of_argv[-1].startswith("--")):
            lines_of_argv[-1] += " " + word
        else:
            lines_of_argv.append(word)
    lines = [
        "#!/usr/bin/env bash",
        HEADER,
        f"# Deployment {spec['marker']}, configuration {spec['config_hash']}, "
        f"SGLang {spec['sglang_version']}.",
        "set -euo pipefail",
        "# The env file holds the environment and the secrets (mode 0600); both service",
        "# managers run this script, so it loads the file itself. The server reads its",
        "# secret options from its --config file (mode 0600), never from its command line.",
        "set -a",
        f". {shlex.quote(paths['env_file'])}",
        "set +a",
        f"cd {shlex.quote(paths['root'])}",
        # Every start opens with this line in the log, whichever manager appends the output:
        # the gate reads the current run from the last one.
        "printf '\\n===== sglang-fleet: start %s config %s at %s =====\\n' "
        f"{shlex.quote(spec['marker'])} {spec['config_hash']} \"$(date '+%Y-%m-%d %H:%M:%S')\"",
        *_secret_guards(spec),
        *_redaction(spec),
        "exec " + " \\\n    ".join(lines_of_argv),
        "",
    ]
    return "\n".join(lines)


def _secret_guards(spec: dict[str, Any]) -> list[str]:
    # A server given `--api-key ""` answers without a key: refuse to start instead.
    return [f': "${{{name}:?is empty: refusing to start with an empty secret}}"'
            for name in spec["secret_env_names"]]


def _redaction(spec: dict[str, Any]) -> list[str]:
    logged = [f"{env}:{SECRET_FIELDS[flag]}" for flag, env in spec["config_options"]
              if flag in SECRET_FIELDS]
    if not logged:
        return []
    python = shlex.quote(spec["install"]["server_python"])
    return ["# SGLang prints its secret options in its arguments line: filter them out of the "
            "log.", f"exec > >(exec {python} -u -c {shlex.quote(_REDACT)} {' '.join(logged)}) "
            "2>&1"]


def env_file(spec: dict[str, Any], secrets: dict[str, str], masked: bool = False) -> str:
    """KEY='value' lines sourced by bash. `secrets` maps secret variable names to values."""
    lines = [HEADER]
    for name in sorted(spec["env"]):
        lines.append(f"{name}={shlex.quote(spec['env'][name])}")
    for name in spec["secret_env_names"]:
        value = MASK if masked else secrets[name]
        lines.append(f"{name}={shlex.quote(value)}")
    return "\n".join(lines) + "\n"


def config_file(spec: dict[str, Any], secrets: dict[str, str], masked: bool = False) -> str:
    """The YAML file SGLang reads with `--config` (mode 0600): the secret options, each under
    its option's spelling without the dashes (`api-key: ...`: SGLang 0.5.23 turns a key back
    into `--KEY` as written, so `api_key` would be an unrecognized argument), so that the
    command line holds only this file's path. Written whole at every deploy (an empty mapping
    when there is no secret option), so a key dropped from the inventory leaves no copy
    behind."""
    # str(): Ansible hands its variables over as tagged str subclasses, which YAML refuses.
    options = {flag.removeprefix("--"): MASK if masked else str(secrets[env])
               for flag, env in spec["config_options"]}
    body = yaml.safe_dump(options, default_flow_style=False, sort_keys=False, width=1 << 16,
                          allow_unicode=True) if options else "{}\n"
    return (f"{HEADER}\n# The server's secret options, read by SGLang with --config (the "
            f"command line holds only\n# this file's path).\n{body}")


def unit_value(text: Any) -> str:
    """A value as a systemd unit file takes it literally: `%` starts a specifier there
    (systemd.unit(5), "Specifiers"), so it is doubled."""
    return str(text).replace("%", "%%")


# Characters systemd refuses in an executable's path ("Executable name contains special
# characters", its string_is_safe()): the unit would fail only when it is started.
UNIT_UNSAFE_CHARACTERS = "\"'\\"


def unit_path_problem(path: str) -> str | None:
    """Why systemd cannot run a program under `path`, or None."""
    bad = sorted(set(c for c in path if c in UNIT_UNSAFE_CHARACTERS))
    if not bad:
        return None
    return (f"holds {' and '.join(repr(c) for c in bad)}, which systemd refuses in the path "
            f"of the program a unit runs: the unit would fail only when it is started")


def unit_command_path(path: str) -> str:
    """An executable's path as the first word of ExecStart=: specifiers escaped (`%%`; a `$`
    is taken literally there, so it stays as it is), and quoted when it holds what would split
    or end the word (white space, `;`) (systemd.service(5), "Command lines"). A plain path
    stays as it is. Quotes and backslashes are refused before (unit_path_problem)."""
    text = unit_value(path)
    if not any(c.isspace() or c in "\"'\\;" for c in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def service_unit(spec: dict[str, Any], description: str, limits: tuple[str, ...] = ()) -> str:
    """The systemd unit of one deployment (a server, or a router): its cgroup is the
    deployment, its log appended to the deployment's log file, no restart loop. Paths and
    names are escaped as systemd reads them (a root such as "/opt/sglang fleet/50%d")."""
    paths, service = spec["paths"], spec["service"]
    return "\n".join([
        HEADER,
        "[Unit]",
        f"Description={unit_value(description)}",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=exec",
        f"User={unit_value(service['user'])}",
        f"WorkingDirectory={unit_value(paths['root'])}",
        f"ExecStart={unit_command_path(paths['script'])}",
        # The whole cgroup is this deployment: stop kills every worker and nothing else.
        "KillMode=control-group",
        "KillSignal=SIGTERM",
        f"TimeoutStopSec={service['stop_timeout']}",
        # No restart loop: a hang or crash must stay visible to the gate and to recovery.
        "Restart=no",
        f"StandardOutput=append:{unit_value(paths['log_file'])}",
        f"StandardError=append:{unit_value(paths['log_file'])}",
        "LimitNOFILE=1048576",
        *limits,
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ])


def systemd_unit(spec: dict[str, Any]) -> str:
    return service_unit(
        spec, f"SGLang server {spec['marker']} (sglang-fleet, config {spec['config_hash']})",
        ("LimitMEMLOCK=infinity",))


def render_files(spec: dict[str, Any], secrets: dict[str, str] | None = None,
                 masked: bool = False) -> dict[str, str | None]:
    """All files of one deployment. With masked=True secrets are replaced by asterisks."""
    secrets = secrets or {}
    missing = [n for n in spec["secret_env_names"] if not secrets.get(n)]
    if missing and not masked:
        raise ValueError(f"the LaunchSpec needs the secrets {missing} but they resolve empty: "
                         "set the secret settings they come from (ansible-vault)")
    return {
        "script": launch_script(spec),
        "env": env_file(spec, secrets, masked=masked),
        "config": config_file(spec, secrets, masked=masked),
        "unit": systemd_unit(spec) if spec["service"]["manager"] == "systemd" else None,
    }


def deployment_files(spec: dict[str, Any], secrets: dict[str, str]) -> dict[str, Any]:
    """A deployment's folders and files as the node writes them (sglang_deployment_files),
    the env file apart because it holds the secrets, and the digest the service will record
    for them (computed as the node computes it from the files on disk)."""
    from sglang_fleet.node.process.service import content_digest

    paths = spec["paths"]
    rendered = render_files(spec, secrets)
    folders = [{"path": paths["root"], "mode": "0755"},
               {"path": paths["conf_dir"], "mode": "0750"},
               {"path": paths["run_dir"], "mode": "0755"},
               {"path": paths["log_dir"], "mode": "0755"}]
    files = [{"path": paths["script"], "content": rendered["script"], "mode": "0755"}]
    secret_files = [{"path": paths["env_file"], "content": rendered["env"], "mode": "0600"},
                    {"path": paths["config_file"], "content": rendered["config"],
                     "mode": "0600"}]
    if rendered["unit"] is not None:
        files.append({"path": paths["unit_file"], "content": rendered["unit"], "mode": "0644"})
    # The service's digest covers script, env file, config file and unit, in that order.
    ordered = [files[0], *secret_files, *files[1:]]
    return {
        "folders": folders,
        "files": files,
        "secret_files": secret_files,
        "checked": [{"path": f["path"], "mode": f["mode"]} for f in ordered],
        "digest": content_digest([(f["path"], f["content"].encode("utf-8")) for f in ordered]),
    }
