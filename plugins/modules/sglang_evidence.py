#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_evidence
short_description: Collect a failed server's evidence on its node before anything is killed
description:
  - Writes a timestamped folder with the verdict, the LaunchSpec that ran (secrets masked at
    any depth), the log tail, the current run's log (its first and last megabytes when it is
    longer) and its phase timeline, the process table with states, a py-spy dump of every
    Python process of the server (its absence is reported, not fatal; the launch script's
    shell is not Python and is not dumped), kernel Xid/OOM lines since the start, and a GPU
    snapshot. The folder is 0700 and every file in it 0600.
  - Packs the folder into one archive beside it (C(<folder>.tar.gz), 0600), so that the
    controller fetches the bundle in one transfer (sglang.fleet.sglang_evidence_fetch, which
    removes the archive once fetched); the folder stays on the node.
  - The LaunchSpec is the one the node recorded when it started the server
    (I(running_spec_file)); when the node recorded none, the controller's I(launch_spec) is
    written instead and C(summary.json) says so. The running configuration's hash comes from
    that file, else the state file, else the live processes' C(SGLANG_FLEET_CONFIG).
  - py-spy can leave a process stopped (state T); every dumped process gets SIGCONT after.
version_added: "0.1.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.from_spec
  - sglang.fleet.sglang_fleet
  - sglang.fleet.sglang_fleet.gpu
  - sglang.fleet.sglang_fleet.attributes
options:
  log_file:
    description: The server log.
    type: path
    required: true
  evidence_dir:
    description: Folder under which the bundle folder is created.
    type: path
    required: true
  verdict:
    description: The verdict that triggered recovery.
    type: dict
    default: {}
  launch_spec:
    description: The controller's LaunchSpec for this host, used when the node recorded no
      running spec.
    type: dict
    default: {}
  running_spec_file:
    description: The copy of the LaunchSpec the node recorded when it last started the
      server (C({run_dir}/{deployment}.running-spec.json)).
    type: path
  kernel_log:
    description: C(kmsg), a simulated kernel log file, or C(none).
    type: str
    default: kmsg
  py_spy:
    description: py-spy executable; when empty it is looked for beside the server's Python
      and on PATH.
    type: str
    default: ""
  server_python:
    description: The server's Python, to find py-spy in its environment.
    type: path
  tail_lines:
    description: Lines in the log tail.
    type: int
    default: 200
"""

EXAMPLES = r"""
- name: Keep the evidence of the LaunchSpec's stalled server
  sglang.fleet.sglang_evidence:
    from_spec: "{{ sglang_server_launch_spec }}"
    verdict: "{{ sglang_server_verdict }}"

- name: Keep the evidence of a stalled server
  sglang.fleet.sglang_evidence:
    marker: "node1:Kimi-K2.5-30000"
    state_file: /opt/sglang-fleet/run/Kimi-K2.5-30000.pid
    log_file: /opt/sglang-fleet/logs/Kimi-K2.5-30000.log
    evidence_dir: /opt/sglang-fleet/evidence
    verdict: "{{ sglang_server_verdict }}"
    launch_spec: "{{ sglang_server_launch_spec }}"
    running_spec_file: /opt/sglang-fleet/run/Kimi-K2.5-30000.running-spec.json
"""

RETURN = r"""
path:
  description: The bundle folder on the node.
  returned: success
  type: str
files:
  description: Files written to the bundle.
  returned: success
  type: list
  elements: str
archive:
  description: The bundle packed in one gzipped tar file beside the folder (its members under
    the folder's name); empty in check mode.
  returned: success
  type: str
py_spy:
  description: py-spy status, the executable used or why no dump was taken.
  returned: success
  type: str
running:
  description: The configuration that ran, as the node recorded it.
  returned: success
  type: dict
  contains:
    config_hash:
      description: The running configuration's 12-hex hash, or null when the node has no
        record of it.
      type: str
    source:
      description: Where the record came from (C(running_spec), C(state_file), C(processes))
        or C(controller) when the node recorded nothing.
      type: str
    settings:
      description: The running LaunchSpec's settings (secrets masked), or null when only the
        hash is known.
      type: dict
    facts:
      description: The running LaunchSpec's facts (what Rules match on), or null.
      type: dict
    note:
      description: Why the controller's LaunchSpec stands in for the running one, if it does.
      type: str
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import tarfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sglang.fleet.plugins.module_utils.common.args import (
    DEPLOYMENT_REQUIRED_IF,
    deployment_argument_spec,
)
from ansible_collections.sglang.fleet.plugins.module_utils.common.files import read_json
from ansible_collections.sglang.fleet.plugins.module_utils.common.secrets import (
    MASK,
    SECRET_FLAGS,
    mask_secrets,
)
from ansible_collections.sglang.fleet.plugins.module_utils.gpu.gpu import (
    GpuQueryTimeout,
    GpuUnavailable,
    gpu_snapshot,
)
from ansible_collections.sglang.fleet.plugins.module_utils.health.observe import (
    kernel_lines,
    read_log,
    xids_and_ooms,
)
from ansible_collections.sglang.fleet.plugins.module_utils.health.stacks import (
    find_py_spy,
    is_python,
)
from ansible_collections.sglang.fleet.plugins.module_utils.logs.logphase import (
    current_run,
    phase_timeline,
    split_lines,
)
from ansible_collections.sglang.fleet.plugins.module_utils.process.procs import (
    deployment_processes,
    environ_of,
    secret_values,
)

# The environment variable the LaunchSpec names its configuration with (spec.CONFIG_VAR).
CONFIG_VAR = "SGLANG_FLEET_CONFIG"


def _dump(py_spy, pid):
    secrets = secret_values(pid)  # py-spy prints the command line, API key included
    try:
        proc = subprocess.run([py_spy, "dump", "--pid", str(pid)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=30)
        text = proc.stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError) as exc:
        text = "py-spy dump failed: %s" % exc
    finally:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGCONT)  # py-spy can leave the target stopped
    # Mask the value where py-spy prints it, the command line, without blanking other text
    # that happens to equal it.
    for secret in secrets:
        flags = "|".join(re.escape(f) for f in SECRET_FLAGS)
        text = re.sub(r"(?<!\S)((?:%s)(?:=|\s+))%s(?=\s|$)" % (flags, re.escape(secret)),
                      lambda m: m.group(1) + MASK, text)
    return text


def running_configuration(p, state, members):
    """What ran: the node's copy of the started LaunchSpec when it has one (and it names the
    same configuration as the state file), else the hash alone from the state file or the
    live processes, else the controller's LaunchSpec with a note saying so."""
    recorded = read_json(p["running_spec_file"]) if p["running_spec_file"] else None
    if not isinstance(recorded, dict) or not recorded.get("config_hash"):
        recorded = None
    state_hash = state.get("config_hash")
    live = sorted(set(filter(None, ((environ_of(m["pid"]) or {}).get(CONFIG_VAR)
                                    for m in members))))
    if recorded and state_hash and recorded["config_hash"] != state_hash:
        recorded = None  # a stale copy: the state file names a later start
    if recorded:
        return recorded, {"config_hash": recorded["config_hash"], "source": "running_spec",
                          "settings": mask_secrets(recorded.get("settings")),
                          "facts": recorded.get("facts"), "note": ""}
    controller = p["launch_spec"]
    known = state_hash or (live[0] if len(live) == 1 else None)
    source = "state_file" if state_hash else "processes" if known else "controller"
    where = p["running_spec_file"] or "(no running_spec_file given)"
    if known and known != controller.get("config_hash"):
        note = ("the node recorded the running configuration %s (%s) but not its LaunchSpec "
                "(%s): launch_spec.json is the controller's %s, which is NOT what ran"
                % (known, source.replace("_", " "), where, controller.get("config_hash")))
    else:
        note = ("the node recorded no running LaunchSpec (%s): launch_spec.json is the "
                "controller's %s" % (where, controller.get("config_hash")))
    use_controller = not known or known == controller.get("config_hash")
    return controller, {"config_hash": known or controller.get("config_hash"),
                        "source": source if known else "controller",
                        "settings": mask_secrets(controller.get("settings"))
                        if use_controller else None,
                        "facts": controller.get("facts") if use_controller else None,
                        "note": note}


def pack(path):
    """The bundle in one gzipped tar beside it, 0600 from creation: one transfer to the
    controller instead of a fetch (and its remote stat) per file."""
    archive = path + ".tar.gz"
    fd = os.open(archive, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w:gz") as tar:
        tar.add(path, arcname=os.path.basename(path))
    return archive


def main():
    module = AnsibleModule(
        argument_spec=deployment_argument_spec(
            log_file=dict(type="path", required=True),
            evidence_dir=dict(type="path", required=True),
            verdict=dict(type="dict", default={}),
            launch_spec=dict(type="dict", default={}),
            running_spec_file=dict(type="path"),
            kernel_log=dict(type="str", default="kmsg"),
            py_spy=dict(type="str", default=""),
            server_python=dict(type="path"),
            tail_lines=dict(type="int", default=200),
        ),
        required_if=DEPLOYMENT_REQUIRED_IF,
        supports_check_mode=True,
    )
    p = module.params
    stamp = time.strftime("%Y%m%dT%H%M%S")
    name = "%s-%s" % (stamp, p["marker"].split(":", 1)[-1])
    path = os.path.join(p["evidence_dir"], name)
    if module.check_mode:
        module.exit_json(changed=True, path=path, files=[], archive="",
                         py_spy="not run in check mode", running={})
    os.makedirs(path, 0o700)
    files = []

    def write(fname, content):
        # 0600 from creation: the bundle holds settings, logs and command lines.
        fd = os.open(os.path.join(path, fname), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(content if isinstance(content, str) else
                    json.dumps(mask_secrets(content), indent=2, sort_keys=True, default=str))
        files.append(os.path.join(path, fname))

    state = read_json(p["state_file"]) or {}
    session = state.get("pid") if p["manager"] == "supervisor" else None
    unit = p["unit_name"] if p["manager"] == "systemd" else None
    members = deployment_processes(p["marker"], session, unit)

    spec, running = running_configuration(p, state, members)
    write("verdict.json", p["verdict"])
    write("launch_spec.json", spec)
    # Bounded: the run's first and last megabytes, from where it began (logread's limits).
    text, _, _ = read_log(p["log_file"], start=state.get("log_offset") or 0)
    run = current_run(text)
    write("run.log", run)
    write("log_tail.txt", "\n".join(split_lines(run)[-p["tail_lines"]:]) + "\n")
    write("phase_timeline.txt", "".join("%-22s %s\n" % row for row in phase_timeline(text)))
    write("processes.txt", "".join(
        "%7d %7d %s %8d %s\n" % (m["pid"], m["ppid"], m["state"],
                                 m["utime_ticks"] + m["stime_ticks"], m["cmdline"])
        for m in members) or "no process of the deployment is running\n")
    py_spy = find_py_spy(p["py_spy"], p["server_python"])
    skipped = []
    if py_spy:
        for m in members:
            if is_python(m["pid"]):
                write("py-spy-%d.txt" % m["pid"], _dump(py_spy, m["pid"]))
            else:
                skipped.append("%d (%s)" % (m["pid"], m["cmdline"][:60]))
        spy_status = py_spy + ("; not Python, not dumped: %s" % ", ".join(skipped)
                               if skipped else "")
    else:
        spy_status = ("py-spy not found (install it with the server: "
                      "sglang_server_pip_extra_packages)")
    since = state.get("started_at") or 0
    xids, ooms = xids_and_ooms(kernel_lines(p["kernel_log"], since), set())
    write("kernel.txt", "".join(x["line"] + "\n" for x in xids + ooms) or
          "no Xid or OOM-killer line since the start\n")
    try:
        write("gpus.json", gpu_snapshot(p["gpu_backend"], p["sim_dir"]))
    except (GpuQueryTimeout, GpuUnavailable) as exc:
        write("gpus.json", {"error": str(exc)})
    write("summary.json", {"marker": p["marker"], "collected_at": time.time(),
                           "py_spy": spy_status, "processes": len(members),
                           "log_file_on_node": p["log_file"],
                           "running_config_hash": running["config_hash"],
                           "running_config_source": running["source"],
                           "note": running["note"]})
    module.exit_json(changed=True, path=path, files=files, archive=pack(path), py_spy=spy_status,
                     running=running)


if __name__ == "__main__":
    main()
