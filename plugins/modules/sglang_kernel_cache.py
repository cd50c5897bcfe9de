#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_kernel_cache
short_description: Compare, freeze and merge JIT kernel caches; keep the controller's snapshots
description:
  - The kernel caches' side of staging (docs/weights.md, "Kernel caches"). A node's live folder
    (the server's C(SGLANG_CACHE_DIR), one per key of SGLang release, GPU architecture and TP)
    is frozen into a snapshot that M(sglang.fleet.sglang_stage) agents move, verified piece by
    piece, to the controller and from it to the nodes that lack it.
  - C(state=compared) makes the live folder when it is missing (owned by I(user)) and counts
    its files against a snapshot's manifest (none: every file is new): C(new_files) the node
    compiled, C(missing_files) it lacks.
  - C(state=frozen) copies the live folder into a snapshot published under I(snapshots)
    (aside, then renamed into place: a kill leaves no half snapshot) and returns its
    manifest; the compilers' work in flight (C(deep_gemm/tmp), C(deep_gemm/locks)) and
    symlinks are left out.
  - C(state=merged) copies each file of a published snapshot that the live folder lacks into
    it, never over a file the node holds; a missing folder arrives whole; everything is owned
    as the live folder is.
  - On the controller, C(state=latest) returns the newest snapshot of each of I(keys) in
    I(store), and C(state=recorded) names a snapshot the store published the newest of its key
    and prunes the key's snapshots to I(keep), never the newest.
version_added: "1.1.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.attributes
options:
  state:
    description: What to do (see the description).
    type: str
    choices: [compared, frozen, merged, latest, recorded]
    required: true
  root:
    description: The deployment's root on the node; I(live) and I(snapshots) must lie inside
      it, without a symlink.
    type: path
  live:
    description: The live cache folder on the node (the server's C(SGLANG_CACHE_DIR)).
    type: path
  snapshots:
    description: The node's folder of snapshots (their staging root).
    type: path
  key:
    description: The cache's key, with C(state=frozen).
    type: str
  keys:
    description: The keys whose newest snapshot C(state=latest) returns.
    type: list
    elements: str
    default: []
  manifest:
    description: A snapshot's manifest (C(compared), C(merged), C(recorded)); null with
      C(compared) when the controller holds none.
    type: dict
  store:
    description: The controller's folder of snapshots (C(latest), C(recorded)).
    type: path
  piece_size:
    description: Bytes per piece of a frozen snapshot's manifest.
    type: int
    default: 16777216
  keep:
    description: With C(state=recorded), snapshots kept per key on the controller.
    type: int
    default: 2
  user:
    description: The server's user, who owns a live folder C(state=compared) makes.
    type: str
    default: root
"""

EXAMPLES = r"""
- name: Count what the node compiled that the controller's snapshot lacks
  sglang.fleet.sglang_kernel_cache:
    state: compared
    live: /opt/sglang-fleet/kernel-cache/0.5.23-sm90-tp8/live
    manifest: "{{ snapshots['0.5.23-sm90-tp8'] }}"

- name: Merge a staged snapshot into the live folder
  sglang.fleet.sglang_kernel_cache:
    state: merged
    root: /opt/sglang-fleet
    live: /opt/sglang-fleet/kernel-cache/0.5.23-sm90-tp8/live
    snapshots: /opt/sglang-fleet/kernel-cache/snapshots
    manifest: "{{ snapshot }}"
"""

RETURN = r"""
new_files:
  description: Files in the live folder that the snapshot lacks.
  type: int
  returned: when compared
missing_files:
  description: Files of the snapshot that the live folder lacks.
  type: int
  returned: when compared
live_files:
  description: Files in the live folder.
  type: int
  returned: when compared
published:
  description: Whether the snapshot is published in the node's I(snapshots).
  type: bool
  returned: when compared
manifest:
  description: The frozen snapshot's manifest (its revision is its content's id).
  type: dict
  returned: when frozen
copied:
  description: Files merged into the live folder.
  type: int
  returned: when merged
snapshots:
  description: Each key's newest snapshot's manifest on the controller, or null.
  type: dict
  returned: when latest
pruned:
  description: The key's snapshots removed from the controller.
  type: list
  elements: str
  returned: when recorded
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sglang.fleet.plugins.module_utils.staging import kernel_cache as kc
from ansible_collections.sglang.fleet.plugins.module_utils.staging import manifest as mf
from ansible_collections.sglang.fleet.plugins.module_utils.staging import node

REQUIRED = {"compared": ("root", "live", "snapshots"),
            "frozen": ("root", "live", "snapshots", "key"),
            "merged": ("root", "live", "snapshots", "manifest"),
            "latest": ("store",), "recorded": ("store", "manifest")}


def _node_paths(p):
    for name in ("live", "snapshots"):
        node.check_under(p["root"], p[name])


def _manifest(p):
    return mf.validate(dict(p["manifest"])) if p["manifest"] else None


def run_state(module):
    p = module.params
    state = p["state"]
    if state == "latest":
        return {"snapshots": dict((k, kc.latest(p["store"], k)) for k in p["keys"])}
    if state == "recorded":
        manifest = _manifest(p)
        if module.check_mode:
            return {"changed": kc.latest(p["store"], manifest["model"]) != manifest}
        changed = kc.record_latest(p["store"], manifest)
        pruned = node.prune(p["store"], manifest["model"], p["keep"], {manifest["revision"]})
        return {"changed": changed or bool(pruned), "pruned": pruned}
    _node_paths(p)
    manifest = _manifest(p)
    if state == "compared":
        made = not os.path.isdir(p["live"])
        if made and not module.check_mode:
            kc.make_live(p["live"], p["user"])
        out = kc.compare(p["live"], manifest)
        out["changed"] = made
        out["published"] = bool(manifest) and node.published(
            node.layout(p["snapshots"], manifest["model"], manifest["revision"]), manifest)
        return out
    if state == "frozen":
        if module.check_mode:
            return {"changed": True}
        manifest, changed = kc.freeze(p["live"], p["snapshots"], p["key"], p["piece_size"])
        return {"changed": changed, "manifest": manifest}
    places = node.layout(p["snapshots"], manifest["model"], manifest["revision"])
    if not node.published(places, manifest):
        module.fail_json(msg="the kernel cache snapshot %s is not published at %s: stage it "
                         "first" % (manifest["revision"], places["publish"]))
    missing = kc.compare(p["live"], manifest)["missing_files"]
    if module.check_mode or not missing:
        return {"changed": bool(missing), "copied": 0}
    copied = kc.merge(p["live"], places["model_dir"], manifest)
    return {"changed": bool(copied), "copied": len(copied)}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", required=True, choices=list(REQUIRED)),
            root=dict(type="path"),
            live=dict(type="path"),
            snapshots=dict(type="path"),
            key=dict(type="str", no_log=False),
            keys=dict(type="list", elements="str", default=[], no_log=False),
            manifest=dict(type="dict"),
            store=dict(type="path"),
            piece_size=dict(type="int", default=16777216),
            keep=dict(type="int", default=2),
            user=dict(type="str", default="root"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    lacking = [name for name in REQUIRED[p["state"]] if not p[name]]
    if lacking:
        module.fail_json(msg="sglang_kernel_cache state=%s needs %s" % (p["state"],
                                                                       ", ".join(lacking)))
    try:
        result = {"changed": False}
        result.update(run_state(module))
    except (mf.ManifestError, node.StageError, OSError) as exc:
        module.fail_json(msg="%s: %s" % (p["state"], exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
