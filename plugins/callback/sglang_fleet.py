# -*- coding: utf-8 -*-
# Ansible's default output, with these changes for operators:
# - one NODE line per host from the node check: what the deploy will do there, and why;
# - one GATE line per host and gate poll: the verdict, the phase's progress, when progress was
#   last seen and the time left in the phase's window or ceiling, instead of "FAILED - RETRYING",
#   and a GATE line the moment a host is ready;
# - a message the project words itself (a debug line, a fail or assert message, the failure
#   message of one of its sglang_* modules) is shown once, as written: not again as an [ERROR]
#   block with the task's source excerpt (ansible-core 2.19 prints every failed task both
#   ways), and not as YAML, which doubles quotes;
# - a refused LaunchSpec is one block per reason, naming every host refused for it;
# - quiet by default: without -v, only those lines, the ready and other messages the playbooks
#   write, failures and the recap; no play or task banners, no ok, changed, skipped or
#   included lines; a GATE line only when a host's phase or progress changed, or once a minute
#   while nothing does.
# At -v every play and task is named with each host's status; every other result (other
# modules' failures, template errors, crashes, unreachable hosts, -vv and above) is shown as
# the default callback shows it.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: sglang_fleet
type: stdout
short_description: Default output with live gate progress and one block per refusal
description:
  - Ansible's default stdout callback. While the health gate polls a host, each poll prints
    the host's verdict, phase, progress (shards, capture batches), how long ago progress was
    seen and the time left in the phase's stall window or ceiling.
  - Messages the project words itself (C(debug) lines, C(fail) and C(assert) messages, the
    failure messages of its C(sglang_*) modules) are shown once, as text, without the
    C([ERROR]) block and source excerpt that ansible-core 2.19 adds to every failed task.
  - A refused LaunchSpec is shown once per distinct reason, naming the hosts it refuses.
  - Without C(-v), only the NODE and GATE lines, the messages the playbooks write (ready
    lines, router membership), failures and the recap are shown; play and task banners, ok,
    changed, skipped and included results are not. A GATE line is shown when a host's phase
    or progress changes, or once a minute while nothing changes.
  - At C(-v) every play and task is named with each host's status; at C(-vv) and above, every
    result is shown as the default callback shows it.
extends_documentation_fragment:
  - default_callback
  - result_format_callback
requirements:
  - set as stdout callback in ansible.cfg
"""

import contextlib
import gc
import os
import signal
import threading
import time

from ansible import constants as C
from ansible.plugins.callback.default import CallbackModule as DefaultCallback

try:  # the collection and the package must be one release
    from ansible_collections.sglang.fleet.plugins.plugin_utils.package_version import version_error
except ImportError:  # loaded as a plain file (a unit test), not by Ansible: nothing to compare
    version_error = None
_VERSION_ERROR = version_error() if version_error else None
try:
    from sglang_fleet.runs.reasons import group_by_reason, hosts_text
except ImportError:  # the package is not importable: refusals are shown host by host
    group_by_reason = None
if _VERSION_ERROR is not None:  # another release's package: said once, and not used
    group_by_reason = None
try:
    from sglang_fleet.node.common.text import inert
except ImportError:  # the package is not importable: control characters are still escaped
    import re as _re

    def inert(text, keep_newlines=True, keep_colour=False):
        return _re.sub(u"[\x00-\x08\x0b-\x1a\x1c-\x1f\x7f-\x9f]",
                       lambda m: "\\x%02x" % ord(m.group(0)), text) if keep_colour else \
            _re.sub(u"[\x00-\x08\x0b-\x1f\x7f-\x9f]",
                    lambda m: "\\x%02x" % ord(m.group(0)), text)

try:  # the run record (run.html, run.json) needs the package, of this collection's release
    from sglang_fleet.record.recorder import RunRecorder
except ImportError:  # the package is not importable: the run has no page
    RunRecorder = None
if _VERSION_ERROR is not None:
    RunRecorder = None

# Seconds between GATE lines of a host whose phase and progress do not change.
GATE_REPEAT_S = 60

_FAIL_ACTIONS = ("fail", "ansible.builtin.fail", "ansible.legacy.fail",
                 "assert", "ansible.builtin.assert", "ansible.legacy.assert")
_DEBUG_ACTIONS = ("debug", "ansible.builtin.debug", "ansible.legacy.debug")
_ASSERT_ACTIONS = ("assert", "ansible.builtin.assert", "ansible.legacy.assert")
# The task files whose failures are a refused LaunchSpec (checked on the controller).
_REFUSAL_FILES = ("/roles/sglang_server/tasks/spec.yml",
                  "/roles/sglang_server/tasks/spec_fallback.yml")
# Result keys Ansible adds that say nothing to an operator.
_QUIET_KEYS = ("changed", "_ansible_no_log", "_ansible_verbose_always", "failed", "skipped",
               "exception", "warnings", "deprecations", "assertion", "evaluated_to")


def _innermost_message(exception):
    """The message at the end of an ansible-core 2.19 error chain (None before 2.19)."""
    event, last = getattr(exception, "event", None), None
    while event is not None:
        last = event
        event = getattr(getattr(event, "chain", None), "event", None)
    return getattr(last, "msg", None)


def _is_refusal(task):
    path = task.get_path() or ""
    return any(name in path for name in _REFUSAL_FILES)


class _InertDisplay(object):
    """The display, with every message made inert before it reaches the terminal: results
    carry text from nodes (log lines, process titles, HTTP bodies) whose escape sequences
    could clear the screen or overwrite earlier lines. Colours the display adds stay."""

    def __init__(self, display):
        self._wrapped = display

    def display(self, msg, *args, **kwargs):
        return self._wrapped.display(inert(msg, keep_colour=True) if isinstance(msg, str)
                                     else msg, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._wrapped, name)


# Filters and actions whose plugin files import the sglang_fleet package (and its warmed
# caches) or the collection's node-side code.
_FORKED_PLUGINS = (
    ("filter", "sglang.fleet.sglang_fleet_launch_spec"),
    ("filter", "sglang.fleet.sglang_fleet_router_spec"),
    ("action", "sglang.fleet.sglang_node"),
    ("action", "sglang.fleet.sglang_service"),
    ("action", "sglang.fleet.sglang_health"),
    ("action", "sglang.fleet.sglang_lock"),
    ("action", "sglang.fleet.sglang_ledger"),
    ("action", "sglang.fleet.sglang_canary"),
    ("action", "sglang.fleet.sglang_stage_source"),
    ("action", "sglang.fleet.sglang_evidence_fetch"),
    # The modules fed only their LaunchSpec or RouterSpec view (plugins/plugin_utils/spec_view.py).
    ("action", "sglang.fleet.sglang_router_node"),
    ("action", "sglang.fleet.sglang_router_probe"),
    ("action", "sglang.fleet.sglang_router_member"),
    ("action", "sglang.fleet.sglang_argcheck"),
    ("action", "sglang.fleet.sglang_deployment_files"),
    ("action", "sglang.fleet.sglang_evidence"),
    ("action", "sglang.fleet.sglang_stop"),
    ("action", "sglang.fleet.sglang_shm_cleanup"),
    ("action", "sglang.fleet.sglang_env"),
    ("action", "sglang.fleet.sglang_port_owner"),
    ("action", "sglang.fleet.sglang_bench"),
    ("action", "sglang.fleet.sglang_kernel_cache"),
)


def _load_plugins_before_fork():
    """ansible-playbook forks a worker per task and host, and a worker imports a plugin file
    that its own process has not (filter and action plugins alike). Loaded here, in
    ansible-playbook's process before its first task, they reach every worker imported: the
    LaunchSpec's tasks, the router's, the node check and each gate poll no longer import the
    package and build its caches once per task and host. A plugin that fails to load here is
    left to the task that uses it, which reports why."""
    from ansible.plugins.loader import action_loader, filter_loader

    loaders = {"filter": filter_loader, "action": action_loader}
    for kind, name in _FORKED_PLUGINS:
        try:
            if kind == "action":
                loaders[kind].get(name, class_only=True)
            else:
                loaders[kind].get(name)
        except Exception:  # noqa: BLE001 - the task that uses it reports the failure
            pass


# The module every host of a deploy runs at once in its node check (see _build_payload_early).
_NODE_CHECK_MODULE = "sglang.fleet.sglang_node"


def _task_actions(items):
    from ansible.playbook.block import Block

    for item in items or []:
        if isinstance(item, Block):
            for part in (item.block, item.rescue, item.always):
                for action in _task_actions(part):
                    yield action
        else:
            yield item.action


def _runs_module(playbook, module):
    """Whether a play of the playbook runs `module` in a task Ansible knows before the run
    (its imports; a role's own tasks), not in one an include adds later."""
    for play in playbook.get_plays():
        blocks = play.pre_tasks + play.tasks + play.post_tasks
        for role in play.roles:
            blocks += role.get_task_blocks()
        if module in _task_actions(blocks):
            return True
    return False


def _build_payload_early(playbook):
    """Ansible builds a module's payload (its module_utils, each parsed and compiled) once per
    run, in the first worker that runs the module, while the workers of the other hosts wait
    on the build's lock: every host's node check waited that long before any node was asked.
    For a playbook that runs the node check, a child process forked here builds it into the
    same cache beside the validation plays, and exits; a build that fails, or is not done in
    time, leaves the first worker to build it as it would have anyway."""
    try:
        if not _runs_module(playbook, _NODE_CHECK_MODULE):
            return None
        pid = os.fork()
    except Exception:  # noqa: BLE001 - only a speed-up: the run goes on as Ansible runs it
        return None
    if pid:
        threading.Thread(target=os.waitpid, args=(pid, 0), daemon=True).start()
        return pid
    code = 1
    try:
        signal.alarm(120)  # never outlives a stuck build
        _build_payload(_NODE_CHECK_MODULE)
        code = 0
    finally:
        os._exit(code)  # noqa: B012 - the child never returns into ansible-playbook


def _build_payload(module):
    from ansible.executor.interpreter_discovery import InterpreterDiscoveryRequiredError
    from ansible.executor.module_common import modify_module
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import module_loader
    from ansible.template import Templar

    found = module_loader.find_plugin_with_context(module, ".py")
    if not found.resolved:
        return
    # Interpreter discovery is asked for after the payload is cached: which Python runs the
    # module is the worker's part.
    with contextlib.suppress(InterpreterDiscoveryRequiredError):
        modify_module(module_name=module, module_path=found.plugin_resolved_path,
                      module_args={}, templar=Templar(loader=DataLoader()),
                      module_compression=C.config.get_config_value(
                          "DEFAULT_MODULE_COMPRESSION"))


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "sglang.fleet.sglang_fleet"

    def __init__(self):
        super(CallbackModule, self).__init__()
        self._display = _InertDisplay(self._display)
        self._refusals = []  # (task, host, message, ignore_errors) of the task in progress
        self._said = {}  # host -> the failure message last shown for it
        self._gate_shown = {}  # host -> (what the last GATE line said, when)
        self._play_banner_due = False  # -v: the play's banner waits for its first task
        self._recorder = None  # the run record's events, when the package is importable

    # ---- the run record ---------------------------------------------------------------

    def _record(self, kind, result, ignore_errors=False):
        if self._recorder is None:
            return
        try:
            self._recorder.result(kind, result._host.get_name(), result._task, result._result,
                                  ignore_errors)
        except Exception as exc:  # noqa: BLE001 - the record never fails the run
            self._record_failed(exc)

    def _record_failed(self, exc):
        self._display.warning("the run record stopped: %s: %s" % (type(exc).__name__, exc))
        self._recorder = None

    def _record_start(self, playbook):
        if RunRecorder is None:
            return
        try:
            self._recorder = RunRecorder.start(getattr(playbook, "_file_name", "playbook"),
                                               C.CONFIG_FILE)
        except Exception as exc:  # noqa: BLE001 - the record never fails the run
            self._record_failed(exc)

    def _record_play(self, play):
        if self._recorder is None or self._recorder.counter:
            return
        try:
            manager = play.get_variable_manager()
            inventory = manager._inventory
            groups = dict((h.name, sorted(g.name for g in h.get_groups()
                                          if g.name not in ("all", "ungrouped")))
                          for h in inventory.get_hosts())
            self._recorder.meta(sglang_fleet_ledger=manager.extra_vars.get(
                "sglang_fleet_ledger"), inventory=", ".join(inventory._sources or []),
                groups=groups)
        except Exception as exc:  # noqa: BLE001 - the record never fails the run
            self._record_failed(exc)

    # ---- quiet by default -------------------------------------------------------------

    def _quiet(self):
        return self._display.verbosity < 1

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super(CallbackModule, self).set_options(task_keys=task_keys, var_options=var_options,
                                                direct=direct)
        if self._quiet():
            # The default callback then prints a task's banner only with a result it shows.
            self._plugin_options["display_ok_hosts"] = False
            self._plugin_options["display_skipped_hosts"] = False

    def _banner(self, task):
        if not self._quiet() and self._last_task_banner != task._uuid:
            self._print_task_banner(task)

    def _gate_line(self, host, text, color, key):
        """A GATE line when the host's phase or progress changed, or a minute passed."""
        now = time.monotonic()
        last = self._gate_shown.get(host)
        if self._quiet() and last and last[0] == key and now - last[1] < GATE_REPEAT_S:
            return
        self._gate_shown[host] = (key, now)
        self._display.display("GATE [%s]: %s" % (host, text), color=color)

    # ---- the gate's polls -------------------------------------------------------------

    def v2_runner_retry(self, result):
        self._record("runner_retry", result)
        self._flush_refusals()
        res = result.result
        if "verdict" not in res:
            return super(CallbackModule, self).v2_runner_retry(result)
        text = res.get("headline") or "%s: %s" % (res["verdict"], res.get("progress_text")
                                                  or res.get("phase"))
        self._gate_line(result.host.get_name(), text, "cyan",
                        (res["verdict"], res.get("phase"), res.get("progress_text")))

    # ---- messages the playbooks write -------------------------------------------------

    def _own_message(self, result):
        """The task's own message when the failure is one the project words itself: a
        fail/assert that ran as written (not a template error in it), or a failure one of
        the project's modules (sglang_*) reported with fail_json (not a crash); else None."""
        action = result.task.action or ""
        ours = action in _FAIL_ACTIONS or action.rsplit(".", 1)[-1].startswith("sglang_")
        if self._display.verbosity >= 2 or not ours or result.task.loop:
            return None
        msg = result.result.get("msg")
        if not isinstance(msg, str) or not msg.strip():
            return None
        exception = getattr(self._current_task_result, "exception", None)
        innermost = _innermost_message(exception) if exception is not None else None
        # The error Ansible raised is the task's own words (an action plugin may add to
        # them); a template error or a crash reads otherwise: keep Ansible's error and source.
        if exception is not None and not (innermost and msg.startswith(innermost)):
            return None
        return msg

    def _refusal_cause(self, result):
        """The cause of a template error while building the LaunchSpec: an inventory value
        that did not resolve (a secret's environment variable unset, with the inventory's
        undef hint), said as a refusal rather than as ansible-core's chain through the
        role's internals; None otherwise, and at -vv (the whole chain, with its sources)."""
        if self._display.verbosity >= 2 or not _is_refusal(result.task):
            return None
        exception = getattr(self._current_task_result, "exception", None)
        return _innermost_message(exception) if exception is not None else None

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record("runner_on_failed", result, ignore_errors)
        message = self._own_message(result) or self._refusal_cause(result)
        host = self.host_label(result)
        if message is None:
            self._flush_refusals()
            if isinstance(result.result.get("msg"), str):
                self._said[host] = result.result["msg"].strip()
            return super(CallbackModule, self).v2_runner_on_failed(result, ignore_errors)
        result.result.pop("exception", None)  # the same message again, with a code excerpt
        self._handle_warnings_and_exception(result)
        if _is_refusal(result.task) and group_by_reason is not None:
            if self._refusals and self._refusals[0][0]._uuid != result.task._uuid:
                self._flush_refusals()
            self._refusals.append((result.task, host, message, ignore_errors))
            return
        self._flush_refusals()
        self._banner(result.task)
        if self._said.get(host) == message.strip() and not ignore_errors:
            # A rescue that fails the host with the failure it rescued: said once, above.
            return
        self._said[host] = message.strip()
        self._show_text("fatal: [%s]: FAILED! =>" % host, message, C.COLOR_ERROR)
        # What else a module returned with its failure (who holds a lock, ...), at -v, as
        # Ansible shows results: the message says what the operator needs.
        extra = dict((k, v) for k, v in result.result.items()
                     if k not in _QUIET_KEYS and k != "msg" and not k.startswith("_ansible"))
        if extra and self._display.verbosity >= 1:
            self._display.display(self._dump_results(extra).lstrip("\n").rstrip(),
                                  color=C.COLOR_ERROR)
        if ignore_errors:
            self._display.display("...ignoring", color=C.COLOR_SKIP)

    def _flush_refusals(self):
        """One block per distinct reason among the hosts the LaunchSpec refused."""
        if not self._refusals:
            return
        refusals, self._refusals = self._refusals, []
        self._banner(refusals[0][0])
        ignored = all(r[3] for r in refusals)
        for hosts, reason in group_by_reason((host, msg) for _, host, msg, _ in refusals):
            same = " (the same on %d hosts)" % len(hosts) if len(hosts) > 1 else ""
            head = "fatal: [%s]: LaunchSpec refused%s:" % (hosts_text(hosts), same)
            # One line per problem, whole: the terminal wraps it, grep finds it.
            lines = [head] + ["    " + x for x in reason.splitlines()]
            self._display.display("\n".join(lines), color=C.COLOR_ERROR)
        if ignored:
            self._display.display("...ignoring", color=C.COLOR_SKIP)

    def _show_text(self, head, text, color):
        lines = text.strip().splitlines()
        if len(lines) == 1:
            self._display.display("%s %s" % (head, lines[0]), color=color)
        else:
            self._display.display("\n".join([head] + ["    " + x for x in lines]), color=color)

    def v2_runner_on_ok(self, result):
        self._record("runner_on_ok", result)
        self._flush_refusals()
        res = result.result
        action = (result.task.action or "").rpartition(".")[2]
        if action == "sglang_evidence_fetch" and self._display.verbosity < 1:
            self._evidence_fetched(result)
            return
        if action == "sglang_node" and res.get("summary"):
            # The node check's one line: what the deploy will do on that node, and why.
            self._display.display("NODE [%s]: %s" % (result.host.get_name(), res["summary"]),
                                  color="cyan")
            gate = res.get("gate") or {}
            if gate.get("verdict") == "progressing" or (
                    gate.get("verdict") == "ready" and not self._quiet()):
                # Nothing was to change and the node check asked the server: its verdict is
                # the gate's (a failed one is shown once, by the task that fails the host; a
                # ready one, quietly, by the host's ready line).
                self._gate_line(result.host.get_name(), gate.get("headline") or gate["verdict"],
                                "green" if gate["verdict"] == "ready" else "cyan",
                                (gate["verdict"], gate.get("phase"), gate.get("progress_text")))
        elif action == "sglang_health" and res.get("verdict") == "ready" and \
                float(res.get("invocation", {}).get("module_args", {}).get("wait") or 0) > 0:
            # The gate's verdict the moment this host has it (the play moves on once every
            # host of the batch has one).
            self._gate_line(result.host.get_name(), res.get("headline") or "ready", "green",
                            ("ready",))
        msg = res.get("msg")
        # A debug line, or the success message of an assert that is not quiet.
        shown = result.task.action in _DEBUG_ACTIONS or (
            result.task.action in _ASSERT_ACTIONS and res.get("_ansible_verbose_always"))
        plain = (shown and isinstance(msg, str) and self._display.verbosity < 2
                 and not result.task.loop and not (set(res) - set(_QUIET_KEYS) - {"msg"}))
        if not plain:
            if self._quiet():
                self._handle_warnings_and_exception(result)
                return None  # an ok or changed result without words of its own
            if self._display.verbosity < 2:
                # -v names every task and its status; the results themselves come at -vv.
                res["_ansible_verbose_override"] = True
            return super(CallbackModule, self).v2_runner_on_ok(result)
        self._banner(result.task)
        self._handle_warnings_and_exception(result)
        self._show_text("ok: [%s] =>" % self.host_label(result), msg, C.COLOR_OK)

    # ---- a recovery's evidence bundle: one line ---------------------------------------

    def _evidence_fetched(self, result):
        """The bundle's fetch in one line: how many files, and where."""
        res = result.result
        self._banner(result.task)
        self._display.display("%s: [%s] => %d files fetched into %s" % (
            "changed" if res.get("changed") else "ok", self.host_label(result),
            len(res.get("files") or ()), res.get("dest") or "(none)"),
            color=C.COLOR_CHANGED if res.get("changed") else C.COLOR_OK)

    def v2_runner_item_on_ok(self, result):
        if self._quiet():
            return None
        return super(CallbackModule, self).v2_runner_item_on_ok(result)

    # ---- everything else flushes the refusals of the task before ----------------------

    def v2_runner_on_skipped(self, result):
        self._flush_refusals()
        return super(CallbackModule, self).v2_runner_on_skipped(result)

    def v2_runner_on_unreachable(self, result):
        self._record("runner_on_unreachable", result)
        self._flush_refusals()
        return super(CallbackModule, self).v2_runner_on_unreachable(result)

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._flush_refusals()
        self._play_banner()
        return super(CallbackModule, self).v2_playbook_on_task_start(task, is_conditional)

    def v2_playbook_on_handler_task_start(self, task):
        self._flush_refusals()
        self._play_banner()
        return super(CallbackModule, self).v2_playbook_on_handler_task_start(task)

    def v2_playbook_on_include(self, included_file):
        self._flush_refusals()
        if self._quiet():
            return None
        return super(CallbackModule, self).v2_playbook_on_include(included_file)

    def v2_playbook_on_no_hosts_matched(self):
        if self._quiet():
            return None
        self._play_banner()
        return super(CallbackModule, self).v2_playbook_on_no_hosts_matched()

    def v2_playbook_on_no_hosts_remaining(self):
        self._flush_refusals()
        self._play_banner()
        return super(CallbackModule, self).v2_playbook_on_no_hosts_remaining()

    def v2_playbook_on_start(self, playbook):
        if _VERSION_ERROR is not None:
            self._display.error(_VERSION_ERROR)
        _load_plugins_before_fork()
        # Every object of this process so far (the inventory, the plugins, the playbook) lives
        # for the whole run. Frozen, a forked worker's garbage collector never walks them, so
        # it neither spends the time nor copies the pages it would touch: each task and host
        # costs less.
        gc.freeze()
        _build_payload_early(playbook)
        self._record_start(playbook)
        return super(CallbackModule, self).v2_playbook_on_start(playbook)

    def v2_playbook_on_play_start(self, play):
        self._flush_refusals()
        self._play = play  # the default callback reads the play's strategy later
        self._record_play(play)
        # -v names a play when it runs a task: a play left with no host after a refusal or a
        # stopped rollout prints nothing.
        self._play_banner_due = not self._quiet()
        return None

    def _play_banner(self):
        if self._play_banner_due:
            self._play_banner_due = False
            super(CallbackModule, self).v2_playbook_on_play_start(self._play)

    def v2_playbook_on_stats(self, stats):
        self._flush_refusals()
        super(CallbackModule, self).v2_playbook_on_stats(stats)
        if self._recorder is not None:
            try:
                page = self._recorder.finish(stats)
                self._display.display("run record: %s" % page)
            except Exception as exc:  # noqa: BLE001 - the record never fails the run
                self._record_failed(exc)
