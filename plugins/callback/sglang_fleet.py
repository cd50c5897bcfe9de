# -*- coding: utf-8 -*-
# The default stdout callback, plus one line per host and gate poll: the phase, its progress
# and when progress was last seen, instead of Ansible's bare "FAILED - RETRYING".
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: sglang_fleet
type: stdout
short_description: Default output with live gate progress per host
description:
  - Ansible's default stdout callback. While the health gate polls a host, each poll prints
    the host's phase, progress (shards, capture batches) and how long ago progress was seen.
extends_documentation_fragment:
  - default_callback
  - result_format_callback
requirements:
  - set as stdout callback in ansible.cfg
"""

import time

from ansible.plugins.callback.default import CallbackModule as DefaultCallback


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "sglang_fleet"

    def v2_runner_on_ok(self, result):
        res, host = result._result, result._host.get_name()
        action = result._task.action.rpartition(".")[2]
        if action == "sglang_node" and res.get("summary"):
            # The node check's one line: what the deploy will do on that node, and why.
            self._display.display("NODE [%s]: %s" % (host, res["summary"]), color="cyan")
        elif action == "sglang_health" and res.get("verdict") == "ready" and \
                float(res.get("invocation", {}).get("module_args", {}).get("wait") or 0) > 0:
            # The gate's verdict the moment this host has it (the play moves on once every
            # host of the batch has one).
            self._display.display("GATE [%s]: ready (%s)" % (host, res.get("reason", "")),
                                  color="green")
        return super(CallbackModule, self).v2_runner_on_ok(result)

    def v2_runner_retry(self, result):
        res = result._result
        if "verdict" not in res:
            return super(CallbackModule, self).v2_runner_retry(result)
        ago = ""
        if res.get("last_progress_at"):
            ago = ", progress %.0f s ago" % max(0, time.time() - res["last_progress_at"])
        self._display.display(
            "GATE [%s]: %s%s (%s; %s polls left)" % (
                result._host.get_name(), res.get("progress_text") or res.get("phase"), ago,
                res["verdict"], res.get("retries", 0) - res.get("attempts", 0)),
            color="cyan")
