#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_stage
short_description: Stage a model revision on a node, verified piece by piece, published atomically
description:
  - One node's side of staging (docs/weights.md). The revision lives in one folder per
    revision under I(root) (C(<root>/<model>/<revision>)), its manifest beside it
    (C(<root>/<model>/.manifests/<revision>.json)).
  - C(state=checked) checks the node's paths (inside I(root), no symlink) and its free disk
    against what the copy still needs, and fails naming need, free and the node, before any
    byte moves.
  - C(state=started) starts the node's staging agent (a detached process in its own session,
    standard-library Python) unless it runs already or the revision is published with this
    manifest. The agent fetches the pieces the node lacks from I(sources) in order, verifying
    each piece's SHA-256 as it arrives, serves the pieces it holds on I(listen_address)
    I(port), and renames the copy into place once every piece is verified. With I(seed_folder)
    it is an origin, serving that folder and counting the bytes it serves.
  - C(state=observed) waits up to I(wait) seconds for the node's progress to change and
    returns the gate's verdict on the C(staging_weights) phase.
  - C(state=verified) reads the published copy against the manifest (C(node_check=full)) or
    checks its files' sizes (C(sizes)); C(state=in_use) records the revision the server runs;
    C(state=pruned) removes revisions beyond the newest I(keep), never the one in use nor
    this one; C(state=stopped) stops this revision's agent.
version_added: "1.1.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.attributes
options:
  state:
    description: What to do (see the description).
    type: str
    choices: [checked, started, observed, verified, in_use, pruned, stopped]
    default: started
  root:
    description: The staging root on the node, inside the deployment's root.
    type: path
    required: true
  manifest:
    description: The revision's manifest (files, sizes, SHA-256 of each file and piece), from
      M(sglang.fleet.sglang_stage_source). Required but for C(state=in_use) and
      C(state=stopped), which take I(model) and I(revision) instead.
    type: dict
  model:
    description: The model's folder name, without I(manifest).
    type: str
  revision:
    description: The revision's folder name, without I(manifest).
    type: str
  node_name:
    description: The node's name in messages.
    type: str
    default: this node
  listen_address:
    description: The address the agent serves pieces on and fetches from (the inventory's).
    type: str
    default: 127.0.0.1
  port:
    description: The agent's port.
    type: int
    default: 7480
  sources:
    description: Where the pieces come from, nearest first, the origin last (peer agents'
      C(http://address:port), or C(files+https://...) for a plain HTTP(S) origin).
    type: list
    elements: str
    default: []
  seed_folder:
    description: Run the agent as the origin, serving this folder (the source's files).
    type: path
  rate_limit:
    description: Bytes per second the agent receives and sends at most (0 for no cap).
    type: int
    default: 0
  stall_window:
    description: Seconds without a new piece after which the gate says C(stalled); a source
      flat for a fifth of it is passed over for the next.
    type: int
    default: 300
  linger:
    description: Seconds the agent keeps serving after no peer asked it for a piece.
    type: int
    default: 120
  wait:
    description: With C(state=observed), seconds to wait for a change before returning.
    type: float
    default: 5
  node_check:
    description: With C(state=verified), C(full) reads every file against its SHA-256,
      C(sizes) compares sizes only.
    type: str
    choices: [full, sizes]
    default: full
  keep:
    description: With C(state=pruned), how many published revisions to keep.
    type: int
    default: 2
  python:
    description: The interpreter that runs the agent; defaults to the module's.
    type: path
  phase:
    description: What is staged, as the gate names the phase (C(staging_weights), a kernel
      cache's snapshot staged to a node, C(staging_kernel_cache), or harvested from one to the
      controller, C(harvesting_kernel_cache)).
    type: str
    choices: [staging_weights, staging_kernel_cache, harvesting_kernel_cache]
    default: staging_weights
"""

EXAMPLES = r"""
- name: Check the disk before any byte moves
  sglang.fleet.sglang_stage:
    state: checked
    root: /opt/sglang-fleet/weights
    manifest: "{{ source.manifest }}"
    node_name: "{{ inventory_hostname }}"

- name: Start the node's staging agent behind the node before it
  sglang.fleet.sglang_stage:
    root: /opt/sglang-fleet/weights
    manifest: "{{ source.manifest }}"
    listen_address: 10.0.0.12
    port: 7480
    sources: [http://10.0.0.11:7480, http://10.0.0.1:7480]
"""

RETURN = r"""
path:
  description: The revision's folder on the node (the server's model path).
  type: str
  returned: always
verdict:
  description: With C(state=observed) and C(state=started), C(ready), C(progressing),
    C(stalled) or C(crashed).
  type: str
  returned: when observed or started
phase:
  description: The I(phase).
  type: str
  returned: when observed or started
progress_text:
  description: Files and bytes held, and the rate, e.g. C(120/163 files, 310 GB of 612, 1.2 GB/s).
  type: str
  returned: when observed or started
need_bytes:
  description: Bytes the copy still needs on the node (with a margin).
  type: int
  returned: when checked
free_bytes:
  description: Bytes free on the node's file system under I(root).
  type: int
  returned: when checked
published:
  description: Whether the revision is already published on the node with this manifest.
  type: bool
  returned: when checked
pruned:
  description: Revisions removed.
  type: list
  elements: str
  returned: when pruned
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sglang.fleet.plugins.module_utils.staging import manifest as mf
from ansible_collections.sglang.fleet.plugins.module_utils.staging import node
from ansible_collections.sglang.fleet.plugins.module_utils.staging.kernel_cache import (
    HARVEST_PHASE,
    STAGE_PHASE,
)

PHASES = [node.PHASE, STAGE_PHASE, HARVEST_PHASE]


def agent_options(p):
    stall = float(p["stall_window"])
    return {"rate_in": p["rate_limit"], "rate_out": p["rate_limit"], "wait_s": 2.0,
            "stall_s": max(1.0, stall / 5), "give_up_s": max(2.0, stall / 2),
            "linger_s": p["linger"]}


def observe(places, manifest, p, wait):
    """The gate's verdict, returned early when the progress changes."""
    deadline = time.monotonic() + wait
    first = None
    while True:
        status = node.read_status(places, timeout=0)
        verdict = node.judge(status, p["stall_window"], node.published(places, manifest),
                             phase=p["phase"])
        key = (verdict["verdict"], verdict.get("progress_text"))
        first = first or key
        if key != first or verdict["verdict"] != "progressing" or time.monotonic() >= deadline:
            verdict.pop("status", None)
            return verdict
        time.sleep(0.2)


def run_state(module, places, manifest):
    p = module.params
    state = p["state"]
    if state == "checked":
        need, free = node.check_disk(places, manifest, p["node_name"])
        return {"need_bytes": need, "free_bytes": free,
                "published": node.published(places, manifest)}
    if state == "started":
        if not p["seed_folder"] and node.published(places, manifest) \
                and not node.agent_pid(places):
            return {"changed": False, "verdict": "ready", "phase": p["phase"],
                    "progress_text": "published"}
        if module.check_mode:
            return {"changed": True}
        node.check_disk(places, manifest, p["node_name"])
        pid, started = node.start_agent(
            places, manifest, (p["listen_address"], p["port"]), p["sources"],
            agent_options(p), seed_folder=p["seed_folder"], python=p["python"])
        out = {"changed": started, "pid": pid}
        node.read_status(places, timeout=30)  # a new agent's first status
        out.update(observe(places, manifest, p, 0))
        if out.get("verdict") == "crashed":
            # An agent that could not start (its port held, say) must stop the play here, not
            # leave the nodes to fetch from whatever answers on that port.
            module.fail_json(msg="%s: the staging agent did not start: %s. Fix: free %s:%s "
                             "or set another port" % (p["node_name"], out.get("message") or
                                                      out.get("progress_text"),
                                                      p["listen_address"], p["port"]), **out)
        return out
    if state == "observed":
        return observe(places, manifest, p, p["wait"])
    if state == "verified":
        problems = (node.verify_published(places, manifest) if p["node_check"] == "full"
                    else node.check_sizes(places, manifest))
        if problems:
            module.fail_json(msg="%s: the copy at %s disagrees with its manifest: %s. Fix: "
                             "remove %s and stage again" % (
                                 p["node_name"], places["publish"], "; ".join(problems[:5]),
                                 places["publish"]), problems=problems, path=places["publish"])
        return {}
    if state == "in_use":
        changed = node.in_use(places) != manifest["revision"]
        if changed and not module.check_mode:
            node.mark_in_use(places, manifest["revision"])
        return {"changed": changed}
    if state == "pruned":
        protect = {manifest["revision"], node.in_use(places)}
        removed = [] if module.check_mode else node.prune(
            places["root"], manifest["model"], p["keep"], protect)
        return {"changed": bool(removed), "pruned": removed}
    return {"changed": False if module.check_mode else node.stop_agent(places)}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="started", choices=[
                "checked", "started", "observed", "verified", "in_use", "pruned", "stopped"]),
            root=dict(type="path", required=True),
            manifest=dict(type="dict"),
            model=dict(type="str"),
            revision=dict(type="str"),
            node_name=dict(type="str", default="this node"),
            listen_address=dict(type="str", default="127.0.0.1"),
            port=dict(type="int", default=7480),
            sources=dict(type="list", elements="str", default=[]),
            seed_folder=dict(type="path"),
            rate_limit=dict(type="int", default=0),
            stall_window=dict(type="int", default=300),
            linger=dict(type="int", default=120),
            wait=dict(type="float", default=5),
            node_check=dict(type="str", default="full", choices=["full", "sizes"]),
            keep=dict(type="int", default=2),
            python=dict(type="path"),
            phase=dict(type="str", default=node.PHASE, choices=PHASES),
        ),
        required_one_of=[("manifest", "revision")],
        required_together=[("model", "revision")],
        supports_check_mode=True,
    )
    p = module.params
    if p["manifest"] is None and p["state"] not in ("in_use", "stopped"):
        module.fail_json(msg="sglang_stage state=%s needs the manifest" % p["state"])
    try:
        if p["manifest"] is None:
            manifest = {"model": p["model"], "revision": p["revision"]}
        else:
            manifest = mf.validate(dict(p["manifest"]))
        places = node.layout(p["root"], manifest["model"], manifest["revision"])
        result = {"changed": False, "path": places["model_dir"]}
        result.update(run_state(module, places, manifest))
    except (mf.ManifestError, node.StageError, OSError) as exc:
        module.fail_json(msg="%s: %s" % (p["node_name"], exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
