#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_stage_source
short_description: Resolve a model source into a revision's manifest and its origin
description:
  - Runs on the controller through its action plugin. A source is a folder on a shared file
    system (C({folder, revision})), a plain HTTP(S) server (C({url, revision}), with the
    manifest published beside the files as C(sglang-manifest.json)) or a Hugging Face Hub
    repository at a commit (C({hf_repo, revision, endpoint})), through huggingface_hub.
  - The manifest lists every file with its size, its SHA-256 and the SHA-256 of each piece. A
    folder's is computed once and kept in I(cache) until a file changes; a Hub revision is
    downloaded once into I(cache) and each LFS file checked against the Hub's SHA-256.
  - A revision that does not exist, or a file that disagrees with what the source states, fails
    with the variable, the value and the fix, and nothing is published.
version_added: "1.1.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.attributes
options:
  source:
    description: The inventory's C(sglang_stage_source).
    type: dict
    required: true
  piece_size:
    description: Bytes per piece (the unit verified as it arrives and fetched again alone).
    type: int
    default: 16777216
  cache:
    description: A folder on the controller for kept manifests and Hub downloads.
    type: path
    required: true
attributes:
  action:
    support: full
"""

EXAMPLES = r"""
- name: Resolve the model source
  sglang.fleet.sglang_stage_source:
    source: {folder: /shared/ckpt/Kimi-K2.5, revision: r1}
    cache: /srv/sglang-fleet/staging
  run_once: true
  register: source
"""

RETURN = r"""
manifest:
  description: The revision's manifest (model, revision, piece_size, files, total_bytes, id).
  returned: success
  type: dict
origin:
  description: C({folder}) served by an origin agent, or C({url}) read in byte ranges.
  returned: success
  type: dict
"""

from ansible_collections.sglang.fleet.plugins.module_utils.common.failing import (
    controller_only,
)


def main():
    controller_only("sglang_stage_source", dict(
        source=dict(type="dict", required=True),
        piece_size=dict(type="int", default=16777216),
        cache=dict(type="path", required=True)))


if __name__ == "__main__":
    main()
