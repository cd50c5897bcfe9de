"""The stdout callback builds the node check module's payload as a playbook starts, in a child
process, into the cache Ansible's workers read: for a playbook that runs the node check, and
only for one. Checked with Ansible's own playbook loader and module builder."""

from __future__ import annotations

import json
import subprocess

from sglang_fleet.testfleet.local import BIN, REPO, ansible_env

# Loads each playbook as ansible-playbook does, calls the callback's hook, and waits (up to
# 60 s) for the payload in this process's cache folder.
SCRIPT = r"""
import importlib.util, json, os, sys, time
from ansible import constants as C
from ansible.plugins.loader import init_plugin_loader
init_plugin_loader(C.COLLECTIONS_PATHS)
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.playbook import Playbook
from ansible.vars.manager import VariableManager
spec = importlib.util.spec_from_file_location("cb", "plugins/callback/sglang_fleet.py")
cb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cb)
loader = DataLoader()
variables = VariableManager(loader=loader, inventory=InventoryManager(loader=loader, sources=[]))
cache = os.path.join(C.DEFAULT_LOCAL_TMP, "ansiballz_cache")
out = {}
for playbook in sys.argv[1:]:
    built = cb._build_payload_early(Playbook.load(playbook, variable_manager=variables,
                                                  loader=loader))
    found, deadline = [], time.monotonic() + 60
    while built and not found and time.monotonic() < deadline:
        time.sleep(0.05)
        found = [n for n in os.listdir(cache) if not n.endswith((".lock", "-part"))] \
            if os.path.isdir(cache) else []
    out[playbook] = {"forked": bool(built), "cached": found}
print(json.dumps(out))
"""


def test_the_node_checks_payload_is_built_before_its_task_and_only_for_a_deploy(tmp_path):
    env = dict(ansible_env(), ANSIBLE_LOCAL_TEMP=str(tmp_path))
    proc = subprocess.run([str(BIN / "python"), "-c", SCRIPT, "bench/floor.yml",
                           "playbooks/deploy.yml"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # The floor runs no node check: nothing forked, nothing built.
    assert out["bench/floor.yml"] == {"forked": False, "cached": []}
    deploy = out["playbooks/deploy.yml"]
    assert deploy["forked"]
    assert deploy["cached"] == [
        "ansible_collections.sglang.fleet.plugins.modules.sglang_node-ZIP_DEFLATED-none"]
