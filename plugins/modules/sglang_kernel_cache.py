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
    its files against its key's newest snapshot (without one, every file is new), returning
    C(new_files), the files the node compiled, and C(missing_files), those it lacks.
  - C(state=frozen) copies the live folder into a snapshot published under I(snapshots)
    (aside, then renamed into place, so that a kill leaves no half snapshot) and returns its
    manifest; the compilers' work in flight (C(deep_gemm/tmp), C(deep_gemm/locks)) and
    symlinks are left out.
  - C(state=merged) copies each file of a published snapshot that the live folder lacks into
    it, never over a file the node holds; a missing folder arrives whole; everything is owned
    as the live folder is.
  - On a node, I(from_spec) (the LaunchSpec) gives I(root), I(key), I(live), I(snapshots) and
    I(user).
  - On the controller, C(state=latest) returns the newest snapshot of each of I(keys) in
    I(store), and C(state=recorded) names a snapshot the store published the newest of its key
    and prunes the key's snapshots to I(keep), never the newest.
version_added: "1.1.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.from_spec
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
    description: The cache's key (its release, GPU architecture and TP).
    type: str
  keys:
    description: The keys whose newest snapshot C(state=latest) returns.
    type: list
    elements: str
    default: []
  newest:
    description: With C(state=compared), each key's newest snapshot on the controller (the
      C(snapshots) that C(state=latest) returns); the node compares with its key's.
    type: dict
    default: {}
  manifest:
    description: A snapshot's manifest (C(merged), C(recorded)).
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
- name: Read the controller's newest snapshot of each key
  sglang.fleet.sglang_kernel_cache:
    state: latest
    store: /srv/sglang-fleet/kernel-caches
    keys: [0.5.23-sm90-tp8]
  delegate_to: localhost
  run_once: true
  register: newest

- name: Count what the node compiled that the controller's snapshot lacks, and the reverse
  sglang.fleet.sglang_kernel_cache:
    state: compared
    from_spec: "{{ sglang_server_launch_spec }}"
    newest: "{{ newest.snapshots }}"
  register: compared

- name: Merge a staged snapshot into the live folder
  sglang.fleet.sglang_kernel_cache:
    state: merged
    from_spec: "{{ sglang_server_launch_spec }}"
    manifest: "{{ compared.manifest }}"
"""

RETURN = r"""
key:
  description: The cache's key.
  type: str
  returned: when compared or frozen
live:
  description: The live folder.
  type: str
  returned: when compared
snapshots:
  description: On a node, its folder of snapshots; with C(state=latest), each key's newest
    snapshot's manifest on the controller, or null.
  type: raw
  returned: when compared, frozen or latest
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
  description: The frozen snapshot's manifest (its revision is its content's id), or with
    C(state=compared) the key's newest snapshot's on the controller (null when it has none).
  type: dict
  returned: when compared or frozen
seed_folder:
  description: The frozen snapshot's files on the node.
  type: str
  returned: when frozen
copied:
  description: Files merged into the live folder.
  type: int
  returned: when merged
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

REQUIRED = {"compared": ("root", "live", "snapshots", "key"),
            "frozen": ("root", "live", "snapshots", "key"),
            "merged": ("root", "live", "snapshots", "manifest"),
            "latest": ("store",), "recorded": ("store", "manifest")}


def _node_paths(p):
    for name in ("live", "snapshots"):
        node.check_under(p["root"], p[name])


def _manifest(p):
    return mf.validate(dict(p["manifest"])) if p["manifest"] else None


def _latest(module, p):
    return {"snapshots": dict((k, kc.latest(p["store"], k)) for k in p["keys"])}


def _recorded(module, p):
    manifest = _manifest(p)
    if module.check_mode:
        return {"changed": kc.latest(p["store"], manifest["model"]) != manifest}
    changed = kc.record_latest(p["store"], manifest)
    pruned = node.prune(p["store"], manifest["model"], p["keep"], {manifest["revision"]})
    return {"changed": changed or bool(pruned), "pruned": pruned}


def _places(p):
    _node_paths(p)
    return {"key": p["key"], "live": p["live"], "snapshots": p["snapshots"]}


def _compared(module, p):
    places = _places(p)
    newest = (p["newest"] or {}).get(p["key"])
    manifest = mf.validate(dict(newest)) if newest else None
    made = not os.path.isdir(p["live"])
    if made and not module.check_mode:
        kc.make_live(p["live"], p["user"])
    out = dict(places, changed=made, manifest=manifest, **kc.compare(p["live"], manifest))
    out["published"] = bool(manifest) and node.published(
        node.layout(p["snapshots"], manifest["model"], manifest["revision"]), manifest)
    return out


def _frozen(module, p):
    places = _places(p)
    if module.check_mode:
        return dict(places, changed=True)
    manifest, changed = kc.freeze(p["live"], p["snapshots"], p["key"], p["piece_size"])
    seed = node.layout(p["snapshots"], p["key"], manifest["revision"])["model_dir"]
    return dict(places, changed=changed, manifest=manifest, seed_folder=seed)


def _merged(module, p):
    _places(p)
    manifest = _manifest(p)
    places = node.layout(p["snapshots"], manifest["model"], manifest["revision"])
    if not node.published(places, manifest):
        if module.check_mode:  # the staging before it did not run
            return {"changed": True, "copied": 0}
        module.fail_json(msg="the kernel cache snapshot %s is not published at %s: stage it "
                         "first" % (manifest["revision"], places["publish"]))
    missing = kc.compare(p["live"], manifest)["missing_files"]
    if module.check_mode or not missing:
        return {"changed": bool(missing), "copied": 0}
    copied = kc.merge(p["live"], places["model_dir"], manifest)
    return {"changed": bool(copied), "copied": len(copied)}


STATES = {"latest": _latest, "recorded": _recorded, "compared": _compared, "frozen": _frozen,
          "merged": _merged}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", required=True, choices=list(REQUIRED)),
            root=dict(type="path"),
            live=dict(type="path"),
            snapshots=dict(type="path"),
            key=dict(type="str", no_log=False),
            keys=dict(type="list", elements="str", default=[], no_log=False),
            newest=dict(type="dict", default={}),
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
        result.update(STATES[p["state"]](module, p))
    except (mf.ManifestError, node.StageError, OSError) as exc:
        module.fail_json(msg="%s: %s" % (p["state"], exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
