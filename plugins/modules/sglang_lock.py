#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_lock
short_description: One run per deployment at a time (deploy, recover, watch, stop)
description:
  - Takes, updates or releases a deployment's lock file on the node. Every run that changes
    a deployment takes it; a second run is refused with a message naming the owner.
  - The lock records its owner, the controller run that took it (the ansible-playbook
    process), by a run id unique to that process on its kernel (boot id, PID namespace, PID
    and start time), with its host name and PID for people to read. The C(sglang_lock)
    action plugin fills I(run) in on the controller.
  - The owner renews the lock at each of its lock steps and each gate observation, and
    declares a I(lease), the longest it may go without renewing. A lock held by another run
    is taken over only when its owner is proven gone, by compare-and-swap on I(take_over)
    with a warning line and a ledger entry (I(ledger)). Proven gone means its PID is dead or
    now another process, judged on a controller on the same kernel and in the same PID
    namespace, or as root in that kernel's initial PID namespace (a host name proves
    nothing); or it has not renewed the lock for longer than its lease, timed on the node's
    boot-time clock; or the lock file is empty (after 10 s).
    A stop (I(purpose=stop)) also takes over the lock of an owner it cannot check by its
    PID once that owner has not renewed it for 900 s, instead of its whole lease (a stop only
    ends the deployment). Anything else is refused, naming the owner, when its lease ends (or
    when a stop may take it over) and the fix.
  - The same run taking the lock again (a recovery redeploying through the server role) is
    C(reentered), and its release is left to the outer holder.
  - With I(state=updated), a recovery records its progress in the lock (stage, failed config
    hash, chosen overrides, evidence), so that the run that takes over a killed recovery can
    finish it.
version_added: "0.1.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.attributes
options:
  path:
    description: Lock file (the LaunchSpec's C(paths.recover_lock)).
    type: path
    required: true
  state:
    description: C(acquired) to take the lock, C(updated) to record a recovery's progress in
      the lock this run holds, C(released) to give it back.
    type: str
    choices: [acquired, updated, released]
    default: acquired
  name:
    description: The deployment (its marker), for messages.
    type: str
    default: this deployment
  purpose:
    description: What the run does with the deployment, shown to a refused run.
    type: str
    default: change
  owner:
    description: A description of the run, shown to a refused run.
    type: str
  run:
    description: Identity of the controller run (run_id, host, pid, start_ticks, boot_id,
      pid_ns). The action plugin fills it in; set it only to act for another run.
    type: dict
    required: true
  lease:
    description: Seconds this run may go without renewing the lock before another run may
      take it over (its longest silence, see the role's C(sglang_fleet_lock_lease) filter).
      Declared when the lock is taken or renewed by a reentry.
    type: float
    default: 900
  ledger:
    description: The controller's ledger, where the action plugin records a take-over (and
      the unfinished recovery of the run it replaces, unless this run is a recovery that
      finishes it). Read on the controller only.
    type: path
  take_over:
    description: The exact lock record to replace (the action plugin passes the record of a
      run it found gone); the lock is replaced only if it still holds that record.
    type: dict
  recovery:
    description: Recovery progress to record with I(state=updated), merged into the lock's
      C(recovery) record.
    type: dict
notes:
  - "Lock file (JSON, mode 0600): C(owner), C(purpose), C(name), C(since) (epoch seconds),
    C(run) (C(run_id), C(host), C(pid), C(start_ticks), C(boot_id), C(pid_ns)), C(lease_s),
    C(renewed) (epoch seconds), C(renewed_boot) and C(renewed_uptime) (the node's boot id
    and boot-time clock at the last renewal) and, during a recovery, C(recovery):
    C(stage) (C(stopped), C(chosen), C(recorded)), C(failed_config_hash), C(verdict),
    C(evidence), C(next) (the chosen overrides, source and reason) and C(stop) (what the stop
    did)."
"""

EXAMPLES = r"""
- name: Take the deployment's lock
  sglang.fleet.sglang_lock:
    path: /opt/sglang-fleet/run/Kimi-K2.5-30000.recover.lock
    name: "node1:Kimi-K2.5-30000"
    purpose: recover

- name: Record that the stop is done
  sglang.fleet.sglang_lock:
    path: /opt/sglang-fleet/run/Kimi-K2.5-30000.recover.lock
    state: updated
    recovery:
      stage: stopped
      failed_config_hash: 871281b7a56d

- name: Release it
  sglang.fleet.sglang_lock:
    path: /opt/sglang-fleet/run/Kimi-K2.5-30000.recover.lock
    state: released
"""

RETURN = r"""
outcome:
  description: acquired, reentered (this run held it already), taken_over, held (refused),
    updated, released, or not_held.
  returned: always
  type: str
  sample: acquired
lease_left:
  description: Seconds until the lease of the run holding the lock runs out, unless it
    renews it.
  returned: when held by another run that has a lease
  type: float
silence_s:
  description: Seconds since the run holding the lock last renewed it, on the node's clocks.
    A stop takes over the lock of a run it cannot check once this exceeds 900 s.
  returned: when held by another run
  type: float
lock:
  description: The lock record after the call.
  returned: when this run holds the lock
  type: dict
held_by:
  description: The record of the run holding the lock, when refused; with C(stale), why
    nobody holds it, when the node can tell (an empty lock, a lease run out).
  returned: when held by another run
  type: dict
taken_over:
  description: The record of the gone run whose lock was replaced, with its recovery
    progress if it was recovering.
  returned: when a lock was taken over
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sglang.fleet.plugins.module_utils.common.failing import failing
from ansible_collections.sglang.fleet.plugins.module_utils.deploy.lock import (
    LEASE_S,
    LockError,
    LockFile,
    describe,
    lock_record,
    same_run,
    silence,
)


def _lease_left(held):
    """Seconds until a held lock's lease runs out unless renewed (None: no lease to run)."""
    if held.get("empty") or held.get("unreadable") or not held.get("run"):
        return None
    return max(0.0, float(held.get("lease_s") or LEASE_S) - silence(held))


def _silence(held):
    """Seconds since the holder last renewed the lock, on this node's clocks (None: no run)."""
    if held.get("empty") or held.get("unreadable") or not held.get("run"):
        return None
    return silence(held)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", default="acquired",
                       choices=["acquired", "updated", "released"]),
            name=dict(type="str", default="this deployment"),
            purpose=dict(type="str", default="change"),
            owner=dict(type="str"),
            run=dict(type="dict", required=True),
            lease=dict(type="float", default=LEASE_S),
            take_over=dict(type="dict"),
            recovery=dict(type="dict"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    lock = LockFile(p["path"])
    with failing(module, (LockError, OSError, IOError), "%s: lock %s" % (p["name"], p["path"])):
        if p["state"] == "released":
            if module.check_mode:
                held = lock.read()
                mine = held is not None and same_run(held.get("run"), p["run"])
                module.exit_json(changed=mine, outcome="released" if mine else "not_held")
            done = lock.release(p["run"])
            module.exit_json(changed=done, outcome="released" if done else "not_held")
        if p["state"] == "updated":
            if module.check_mode:
                module.exit_json(changed=True, outcome="updated")
            record = lock.update(p["run"], p["recovery"] or {})
            module.exit_json(changed=True, outcome="updated", lock=record)
        record = lock_record(p["name"], p["purpose"], p["run"], p["owner"], p["lease"])
        if module.check_mode:
            held = lock.read()
            if held is not None and not same_run(held.get("run"), p["run"]):
                module.warn("%s is locked by %s" % (p["name"], describe(held)))
            module.exit_json(changed=held is None, outcome="acquired" if held is None
                             else "held", held_by=held)
        folder = os.path.dirname(p["path"])
        if folder and not os.path.isdir(folder):
            os.makedirs(folder)
        outcome, held = lock.acquire(record, p["take_over"])
    if outcome == "held":
        module.fail_json(
            msg="%s is locked by %s. Not touching it: wait for that run to finish."
            % (p["name"], describe(held)), outcome="held", held_by=held,
            lease_left=_lease_left(held), silence_s=_silence(held))
    result = dict(changed=outcome != "reentered", outcome=outcome,
                  lock=held if outcome == "reentered" else record)
    if outcome == "taken_over":
        result["taken_over"] = held
    module.exit_json(**result)


if __name__ == "__main__":
    main()
