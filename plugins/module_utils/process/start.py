# -*- coding: utf-8 -*-
# The one start and the one stop of a deployment's server, used by the node check (a server
# that is not running) and by sglang_service (a restart after a change, a stop): the checks
# before a start, which refuse it before anything is stopped; the stop of what runs; the GPU
# baseline recovery verifies the GPUs against; the start itself.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ..common.files import write_json_atomic
from ..gpu import gpu
from .service import ServiceError, files_digest
from .startcheck import server_start_blockers


class StartRefused(Exception):
    """What keeps the new server from starting, found before anything was stopped."""

    def __init__(self, message, blockers):
        super(StartRefused, self).__init__(message)
        self.blockers = blockers


class StopIncomplete(Exception):
    """Processes of the deployment survived SIGKILL."""

    def __init__(self, message, report):
        super(StopIncomplete, self).__init__(message)
        self.report = report


def start_server(service, status, options, stop_timeout=60, devices=None, check_mode=False,
                 warn=None):
    """(Re)start a deployment's server. `status` is the service's status now, `options` the
    start's (sglang_service's START_OPTIONS with log_file, state_file, shm_dir and, for the
    baseline without `devices`, gpu_backend and sim_dir). Returns what was done: action, pid,
    digest, config_hash, start_blockers, stop_report. Raises StartRefused (nothing stopped),
    StopIncomplete, or ServiceError/OSError from the start."""
    members = status.get("members") or []
    running = status["running"] or bool(members)
    result = dict(action="restarted" if status["running"] else "started",
                  config_hash=options["config_hash"],
                  start_blockers=server_start_blockers(options, [m["pid"] for m in members]))
    if check_mode:
        for line in result["start_blockers"]:
            (warn or (lambda _: None))("the start would fail: %s" % line)
        return result
    if result["start_blockers"]:
        kept = (" Nothing was stopped: the running server (pid %s, config %s) keeps serving."
                % (status["pid"], status["config_hash"] or "unrecorded")
                if status["running"] else " Nothing was started.")
        raise StartRefused("%s: the new server cannot start here: %s.%s"
                           % (options.get("marker") or service.marker,
                              "; ".join(result["start_blockers"]), kept),
                           result["start_blockers"])
    if running:
        result["stop_report"] = stop_server(service, stop_timeout)
    if options.get("baseline_file"):
        record_baseline(options, devices, warn)
    result["digest"] = files_digest(options["config_files"])
    result["pid"] = service.start(result["digest"], options["config_hash"],
                                  options.get("launch_spec"), options.get("running_spec_file"))
    return result


def stop_server(service, timeout, by=None):
    """Stop every process of the deployment (TERM, then KILL), waiting until none is left."""
    report = service.stop(timeout, by=by)
    if report["remaining"]:
        raise StopIncomplete(
            "processes of the deployment survived SIGKILL (D state?): %s; run "
            "playbooks/recover.yml, or reboot the node"
            % ", ".join("%d(%s)" % (x["pid"], x["state"]) for x in report["remaining"]),
            report)
    return report


def record_baseline(options, devices=None, warn=None):
    """The memory each GPU holds before the server starts (from `devices`, a snapshot just
    taken, or a new one)."""
    if devices is None:
        try:
            devices = gpu.gpu_snapshot(options["gpu_backend"], options.get("sim_dir"))
        except (gpu.GpuQueryTimeout, gpu.GpuUnavailable) as exc:
            (warn or (lambda _: None))("no GPU baseline recorded: %s" % exc)
            return
    write_json_atomic(options["baseline_file"], gpu.baseline(devices))


__all__ = ["ServiceError", "StartRefused", "StopIncomplete", "record_baseline", "start_server",
           "stop_server"]
