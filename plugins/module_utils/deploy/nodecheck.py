# -*- coding: utf-8 -*-
# Everything a deploy needs to know about a node before it changes anything, in one pass: the
# server's interpreter, a reboot mark left by recovery, the GPUs against the inventory, the
# simulated node's hardware (provisioned), shared memory leaked by the last run (removed), the
# service's state, whether the launch files on disk are the rendered ones, and whether the
# installed SGLang already parsed this command line. A deploy that finds nothing to change
# stops here and asks only the gate.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import stat
import threading

from ..common.files import read_json
from ..common.secrets import vanished_secret
from ..gpu import gpu, modelfit, simnode
from ..health import gate
from ..process import service as service_mod
from ..process import shm
from ..process.procs import describe_foreign, service_uid
from ..process.start import StartRefused, start_server
from ..process.startcheck import (
    orphan_refusal,
    other_deployments_running,
)
from . import deployfiles
from . import lock as lk
from .argcheck import (
    args_record,
    parse_args,
    record_args_checked,
)


class NodeRefused(Exception):
    """The node cannot take this deployment; the message names the fix."""


class _Background(threading.Thread):
    """One call that waits on something else (the server's /health, the server Python's
    import of SGLang), run beside the GPU query."""

    def __init__(self, call, *args):
        super(_Background, self).__init__(daemon=True)
        self.call, self.args = call, args
        self.value = None
        self.error = None

    def run(self):
        # Any failure goes back to the module's thread, which reports it: an exception left
        # in this thread would vanish and the module would return without a word.
        try:
            self.value = self.call(*self.args)
        except Exception as exc:  # noqa: BLE001 - re-raised by check_node
            self.error = exc

    def result(self):
        self.join()
        if self.error is not None:
            raise self.error
        return self.value


def _parse_and_record(python, parser, args, record_file):
    """The argument check of a deploy that changes the server, done in the node check: None
    when the installed SGLang accepts the arguments (recorded), else its refusal, which the
    role's argument check then reports."""
    rejected = parse_args(python, parser, args)
    if rejected is None:
        record_args_checked(record_file, args_record(python, parser, args))
    return rejected


def _take_lock(lock):
    """The deployment's lock for a deploy that changes it, when it is free or this run holds
    it already (a recovery redeploying). A lock held by another run is left to the role's lock
    step, which takes over a gone owner's lock or refuses, naming the owner."""
    folder = os.path.dirname(lock["path"])
    if folder and not os.path.isdir(folder):
        os.makedirs(folder)
    record = lk.lock_record(lock["name"], lock["purpose"], lock["run"],
                            lease=lock.get("lease"))
    outcome, held = lk.LockFile(lock["path"]).acquire(record)
    if outcome == "held":
        return {"outcome": "held", "held_by": held}
    return {"outcome": outcome, "lock": held if outcome == "reentered" else record}


def _files_state(files, folders, expected_digest):
    """(current, reason): whether the launch files on disk are the rendered ones, modes
    included."""
    if expected_digest and service_mod.files_digest([f["path"] for f in files]) != \
            expected_digest:
        return False, "the launch files differ from the rendered ones"
    for item in list(files) + list(folders):
        try:
            mode = stat.S_IMODE(os.stat(item["path"]).st_mode)
        except OSError:
            return False, "%s is missing" % item["path"]
        if mode != int(item["mode"], 8):
            return False, "%s has mode %04o, not %s" % (item["path"], mode, item["mode"])
    return True, "the launch files are the rendered ones"


def _write_files(p, want_diff, result):
    """The launch files of a deploy that holds the lock and whose arguments SGLang accepts,
    written in the node check's run instead of one of their own. A failure is left to the
    role's files step, which fails with it while the release of the lock is certain."""
    try:
        actions, diffs = deployfiles.plan(p["folders"], deployfiles.to_write(
            p["write"]["files"], p["write"]["secret_files"]))
        deployfiles.apply(actions)
    except (deployfiles.DeployFilesError, OSError, IOError, ValueError) as exc:
        result["files_error"] = "cannot write the deployment's files: %s" % exc
        return
    result["files_written"] = [item["path"] for _, item in actions]
    result["changed"] = result["changed"] or bool(actions)
    if want_diff:
        result["diff"] = diffs


def _start_server(p, service, status, devices, result, warn):
    """Start a server that is not running (the one start, module_utils/process/start), in the node
    check's run once it holds the lock and the launch files are the rendered ones, its GPU
    baseline from the snapshot just taken. Anything in the way is left to the role's service
    step, which fails with it while the release of the lock is certain."""
    svc, start = p["service"], p["start"]
    options = dict(start, log_file=svc["log_file"], state_file=svc["state_file"],
                   shm_dir=p["shm_dir"], marker=svc["marker"])
    for line in describe_foreign(status["foreign"], svc["user"]):
        warn(line)
    try:
        started = start_server(service, status, options, devices=devices, warn=warn)
    except StartRefused as exc:
        result["start_blockers"] = exc.blockers
        return
    except (service_mod.ServiceError, OSError, IOError) as exc:
        result["start_error"] = "could not start %s: %s" % (svc["marker"], exc)
        return
    result["started"] = dict(action="started", pid=started["pid"],
                             config_hash=start["config_hash"], digest=started["digest"],
                             changed=True)
    result["changed"] = True


def _refuse_orphans(svc, previous_roots=()):
    """Another deployment of this host still running under this root (left by a change of
    port or name), or under a root it ran from before (a change of root with it), is refused
    before anything changes."""
    orphans = other_deployments_running(svc["state_file"], svc["marker"])
    if orphans:
        raise NodeRefused(orphan_refusal(svc["marker"], orphans))
    name = os.path.basename(svc["state_file"])
    for root in previous_roots or ():
        orphans = other_deployments_running(os.path.join(root, "run", name), svc["marker"])
        if orphans:
            raise NodeRefused(orphan_refusal(svc["marker"], orphans, root))


def _check_model(model, devices):
    """The node's own copy of the model against the layout and these GPUs, before anything
    changes: what SGLang would refuse only once the weights load."""
    read = modelfit.read_model(model["path"])
    if read is None:
        return  # not a model folder here: the checks before a start say so
    shape, weights = read
    name = "the model at %s" % model["path"]
    layout = model["layout"]
    problems = modelfit.layout_problems(name, shape, layout)
    fit = modelfit.fit_problem(name, weights, layout,
                               min(d["memory_total"] for d in devices),
                               model.get("mem_fraction_static"))
    problems += [fit] if fit else []
    if problems:
        raise NodeRefused("; ".join(
            "sglang_server_%s=%s: %s (read from its config.json and checkpoint on this node). "
            "Fix: %s" % (x["variable"], x["value"], x["problem"], x["fix"]) for x in problems))


def _check_secrets_kept(secrets, before):
    """A secret the deployment last started with (`before`, its running LaunchSpec), missing
    now, is refused before anything changes."""
    refusal = vanished_secret(secrets, before, "sglang_server_drop_secrets")
    if refusal:
        raise NodeRefused(refusal)


def _refuse_early(p):
    """What refuses the node before it is even looked at: a missing interpreter, a reboot
    mark, a secret that vanished."""
    python = p["server_python"]
    if python and not os.path.exists(python):
        raise NodeRefused(
            "sglang_server_python=%s does not exist on the node. Fix: point it at the Python "
            "of the environment that has SGLang (install_mode existing) or of sglang-fleet "
            "(install_mode simulator)" % python)
    if p["reboot_mark"] and os.path.exists(p["reboot_mark"]):
        raise NodeRefused(
            "recovery marked this node for reboot (%s): GPU memory stayed held after its "
            "server was killed. Fix: reboot the node (or reset its GPUs), then clear the mark "
            "with ansible-playbook playbooks/recover.yml --limit %s "
            "-e sglang_recover_clear_reboot_mark=true" % (p["reboot_mark"], p["host_name"]))
    if p.get("secrets"):
        _check_secrets_kept(p["secrets"], _running_spec(p))


def _running_spec(p):
    return (read_json(p["running_spec_file"]) if p.get("running_spec_file") else None) or {}


def setting_changes(before, after, most=6):
    """What differs between two LaunchSpecs' public settings, one `name: old -> new` each,
    nested mappings by key (`sglang_server_nccl_profile.NCCL_PROTO: LL -> Simple`). Beyond
    `most`, the rest are named without their values (`3 more: a.x, a.y, b`), and the ones
    shown with values are each setting's first change before any setting's second: six keys
    of one mapping never hide a change of another setting."""
    changes = []  # (setting, name, text), in name order
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            changes += [(name, "%s.%s" % (name, key), "%s.%s: %s -> %s" % (
                name, key, _shown(old.get(key)), _shown(new.get(key))))
                for key in sorted(set(old) | set(new), key=str) if old.get(key) != new.get(key)]
        else:
            changes.append((name, name, "%s: %s -> %s" % (name, _shown(old), _shown(new))))
    if len(changes) <= most:
        return [text for _, _, text in changes]
    # Rank each change by how many changes of its setting come before it: first changes first.
    seen, ranked = {}, []
    for i, (setting, _, _) in enumerate(changes):
        seen[setting] = seen.get(setting, 0) + 1
        ranked.append((seen[setting], i))
    shown = set(i for _, i in sorted(ranked)[:most])
    hidden = [name for i, (_, name, _) in enumerate(changes) if i not in shown]
    return [text for i, (_, _, text) in enumerate(changes) if i in shown] + [
        "%d more: %s" % (len(hidden), ", ".join(hidden))]


def _shown(value):
    if value is None:
        return "unset"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 40 else text[:37] + "..."


def check_node(p, check_mode, warn, want_diff=False, health=None):
    """One node check; `p` holds the module's parameters. Returns the module's result: what
    the node has (observe), what differs from the rendered deployment and why, and what the
    check could do itself (the lock, the files, the start of a server that is not running).
    `health`: the server's /health asked when the module started (module_utils/common/http), which
    the gate's observation uses when it answered 200."""
    result = dict(changed=False)
    _refuse_early(p)
    _refuse_orphans(p["service"], p.get("previous_roots"))
    _provision_simulated_node(p, check_mode, result)
    service, status = _service_status(p["service"])
    result["service"] = dict(running=status["running"], pid=status["pid"],
                             digest=status["digest"], config_hash=status["config_hash"])
    _compare_files(p, status, result)
    changing = not (result["files_current"] and result["service_current"])
    observation, parsing = _start_background_work(p, changing, check_mode, result, health)
    devices = _check_gpus(p, check_mode, result, warn)
    if p.get("model") and devices:
        _check_model(p["model"], devices)
    if not status["running"] and not status["members"]:
        _remove_leaked_segments(p, check_mode, result)
    _collect_background_work(observation, parsing, result)
    if changing and not check_mode:
        _change_what_needs_no_drain(p, service, status, devices, result, want_diff, warn)
    result["summary"] = _summary(result)
    return result


def _provision_simulated_node(p, check_mode, result):
    sim = p.get("sim") or None
    if not sim:
        return
    model = os.path.realpath(sim["model_dir"])
    root = os.path.realpath(sim["root"])
    if not (model + "/").startswith(root.rstrip("/") + "/"):
        raise NodeRefused(
            "sglang_server_model_path=%s is outside %s, the simulated node's folder: the "
            "simulator writes its stand-in model at the model path and writes nothing "
            "outside that folder. Fix: set sglang_server_model_path under %s"
            % (sim["model_dir"], root, root))
    written = simnode.provision(p["sim_dir"], simnode.node_devices(p["host_name"], sim),
                                sim["model_dir"], simnode.model_files(sim, sim["family"]),
                                sim["shm_dir"], check_mode)
    result["provisioned"] = written
    result["changed"] = bool(written)


def _service_status(svc):
    """The deployment's service and its status; a running server is read from its state file
    (the common case of a re-run: no scan of the node's processes)."""
    try:
        service = service_mod.service_of(svc)
        if service.running():
            state = read_json(svc["state_file"]) or {}
            return service, {"running": True, "members": None, "digest": state.get("digest"),
                             "config_hash": state.get("config_hash"),
                             "pid": state.get("pid") if svc["manager"] == "supervisor"
                             else None}
        return service, service.status()
    except service_mod.ServiceError as exc:
        raise NodeRefused(str(exc)) from exc


def _compare_files(p, status, result):
    """Whether the files on disk and the running server are the rendered ones (and which
    settings differ from the running LaunchSpec's), and whether SGLang parsed these
    arguments before."""
    files_current, why = _files_state(p["files"], p["folders"], p["expected_digest"])
    result["files_current"] = files_current
    before = _running_spec(p).get("settings")
    if not files_current and p.get("settings") and before:
        changes = setting_changes(before, p["settings"])
        if changes:
            why = "%s: %s" % (why, "; ".join(changes))
    result["files_reason"] = why
    result["service_current"] = bool(status["running"]) and \
        status["digest"] == p["expected_digest"]
    python = p["server_python"]
    record = None
    if p["argcheck_record"] and files_current and python:
        record = args_record(python, p["args_parser"], p["args"])
    stored = read_json(p["argcheck_record"]) if p["argcheck_record"] else None
    result["argcheck_current"] = bool(record and stored and stored.get("record") == record)


def _judge(p, health):
    return gate.judge(p, False, health_answered=health is not None and health.answered())


def _start_background_work(p, changing, check_mode, result, health):
    """Calls that wait on something else, started beside the GPU query: the gate's first
    observation when nothing is to change (a re-run asks the server in this module run), and
    the installed SGLang's parse of arguments it has not parsed yet."""
    observation = parsing = None
    if p.get("gate") and not check_mode and not changing and result["argcheck_current"]:
        observation = _Background(_judge, p["gate"], health)
        observation.start()
    python = p["server_python"]
    if python and p["argcheck_record"] and not result["argcheck_current"] and not check_mode:
        parsing = _Background(_parse_and_record, python, p["args_parser"], p["args"],
                              p["argcheck_record"])
        parsing.start()
    return observation, parsing


def _check_gpus(p, check_mode, result, warn):
    """The node's GPUs against the inventory's count and compute capability."""
    if check_mode and p.get("sim") and result["changed"]:
        return []  # a simulated node not provisioned yet has no GPUs to read
    try:
        devices = gpu.gpu_snapshot(p["gpu_backend"], p["sim_dir"], p["gpu_timeout"],
                                   python=p["server_python"])
    except (gpu.GpuQueryTimeout, gpu.GpuUnavailable) as exc:
        if not check_mode:
            raise NodeRefused("GPU query failed (%s backend): %s"
                              % (p["gpu_backend"], exc)) from exc
        warn("GPU query failed in check mode (%s backend): %s" % (p["gpu_backend"], exc))
        return []
    ccs = sorted(set(d["compute_capability"] for d in devices))
    result["gpus"] = dict(count=len(devices), compute_capabilities=ccs)
    if len(devices) != p["gpu_count"] or ccs != [p["compute_capability"]]:
        raise NodeRefused(
            "the node has %d GPU(s) with compute capability %s, the inventory says "
            "sglang_server_gpu_count=%s and sglang_server_gpu_compute_capability=%s. "
            "Fix: correct those variables for this host (or its group)"
            % (len(devices), ", ".join(ccs) or "none", p["gpu_count"],
               p["compute_capability"]))
    return devices


def _remove_leaked_segments(p, check_mode, result):
    svc = p["service"]
    remove, kept = shm.leaked_segments(p["shm_dir"], svc["state_file"], svc["marker"],
                                       service_uid(svc["user"]))
    result["shm_removed"], result["shm_kept_in_use"] = remove, kept
    if remove:
        result["changed"] = True
        if not check_mode:
            for path in remove:
                os.unlink(path)


def _collect_background_work(observation, parsing, result):
    if parsing is not None:
        rejected = parsing.result()
        result["argcheck_current"] = rejected is None
        result["args_parsed"] = "accepted" if rejected is None else "rejected"
    if observation is not None:
        try:
            result["gate"] = observation.result()
        except (gate.GateArgsInvalid, OSError, IOError) as exc:
            # Anything else is a bug and keeps its traceback, as sglang_health would crash.
            raise NodeRefused("the gate's observation failed: %s" % exc) from exc


def _change_what_needs_no_drain(p, service, status, devices, result, want_diff, warn):
    """Last, once nothing here can refuse the node: the lock of a deploy that changes it,
    then the files (when SGLang accepts the arguments), then the start of a server that is
    not running and has no process left to stop."""
    if not p.get("lock"):
        return
    try:
        result["lock"] = _take_lock(p["lock"])
    except lk.LockError as exc:
        raise NodeRefused("%s: lock %s: %s" % (p["lock"]["name"], p["lock"]["path"],
                                               exc)) from exc
    if result["lock"]["outcome"] not in ("acquired", "reentered") or \
            not result["argcheck_current"]:
        return
    if p.get("write") and not result["files_current"]:
        _write_files(p, want_diff, result)
    if p.get("start") and (result["files_current"] or "files_written" in result) \
            and not status["running"] and not status["members"]:
        _start_server(p, service, status, devices, result, warn)


def _summary(r):
    """One line for the operator: what this deploy will do on the node, and why."""
    service = r["service"]
    if r.get("args_parsed") == "accepted":
        args = "the installed SGLang parsed the arguments in this check and accepts them"
    elif r.get("args_parsed") == "rejected":
        args = "the installed SGLang rejects the arguments (the argument check says why)"
    elif r["argcheck_current"]:
        args = "argument check skipped: the installed SGLang parsed this command line before"
    else:
        args = "arguments to be parsed by the installed SGLang"
    if r["files_current"] and r["service_current"]:
        head = "unchanged: the server runs from the rendered files (config %s)" % (
            service["config_hash"] or "unrecorded")
    else:
        state = ("running from other files" if service["running"] else "not running")
        head = "to change: %s; server %s" % (r["files_reason"], state)
    notes = []
    if r.get("files_written"):
        notes.append("launch files written (%d changed)" % len(r["files_written"]))
    if r.get("started"):
        notes.append("server started (pid %s)" % r["started"]["pid"])
    if r.get("provisioned"):
        notes.append("simulated node provisioned (%d files)" % len(r["provisioned"]))
    if r.get("shm_removed"):
        notes.append("%d leaked shared-memory segment(s) removed" % len(r["shm_removed"]))
    return "; ".join([head, args] + notes)
