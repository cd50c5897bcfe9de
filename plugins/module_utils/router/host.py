# -*- coding: utf-8 -*-
# SGLang's router on its host, in one pass: whether the pinned sglang-router is installed, its
# files (folders, launch script, 0600 env file, unit) written by the deployment file writer, its
# command parsed by the installed router when the files or the router changed, the router
# started or restarted by the service (the same start the servers have), and its answer
# awaited. A re-run that finds nothing to change reads the files, the service's record, the
# parser's fingerprint and one /liveness, and makes the router report's one visit: its workers
# and one request answered through it.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import glob
import os
import re
import time

from ..common.files import read_json
from ..common.secrets import vanished_secret
from ..deploy import deployfiles
from ..deploy.argcheck import (
    args_record,
    parse_args,
    record_args_checked,
)
from ..process import service as service_mod
from ..process.procs import describe_foreign
from ..process.startcheck import server_start_blockers
from .api import RouterUnreachable, ask, http, report_line, router_verdict

# The router's description as its host is given it (sglang_router_node's `router` option,
# built on the controller by router_render.router_node).
ROUTER_OPTIONS = dict(
    marker=dict(type="str", required=True),
    config_hash=dict(type="str", required=True),
    version=dict(type="str", required=True),
    folders=dict(type="list", elements="dict", default=[],
                 options=dict(path=dict(type="path", required=True),
                              mode=dict(type="str", required=True))),
    files=dict(type="list", elements="dict", default=[], options=deployfiles.FILE_OPTIONS),
    secret_files=dict(type="list", elements="dict", default=[],
                      options=deployfiles.SECRET_FILE_OPTIONS),
    service=dict(type="dict", required=True, options=dict(
        manager=dict(type="str", required=True, choices=["systemd", "supervisor"]),
        unit_name=dict(type="str"),
        state_file=dict(type="path", required=True),
        script=dict(type="path"),
        log_file=dict(type="path"),
        workdir=dict(type="path", default="/"),
        user=dict(type="str", default="root"),
        stop_timeout=dict(type="int", default=60),
    )),
    install=dict(type="dict", required=True, options=dict(
        mode=dict(type="str", required=True, choices=["pip", "existing"]),
        python=dict(type="path"),
        router_python=dict(type="path", required=True),
        venv=dict(type="path"),
        requirements=dict(type="list", elements="str", default=[]),
    )),
    args=dict(type="list", elements="str", default=[], no_log=False),
    args_parser=dict(type="str", default="sglang_router.launch_router:parse_router_args"),
    argcheck_record=dict(type="path"),
    liveness_url=dict(type="str", required=True),
    url=dict(type="str"),
    admin_url=dict(type="str"),
    admin_key=dict(type="str", no_log=True),
    api_key=dict(type="str", no_log=True),
    policy=dict(type="str", default=""),
    flag_variables=dict(type="dict", default={}),
    running_spec_file=dict(type="path"),
    secrets=dict(type="dict", options=dict(
        names=dict(type="list", elements="str", default=[], no_log=False),
        variables=dict(type="list", elements="list", default=[], no_log=False),
        drops=dict(type="list", elements="str", default=[], no_log=False),
        fingerprints=dict(type="dict", default={}, no_log=False),
    )),
)

# The report's request asked by a check that changed nothing: one that has not answered by
# then is asked again, with the report's own timeout, once the servers are deployed.
REPORT_TIMEOUT = 5
# A parse takes two seconds; one that has not ended in a minute will not.
PARSE_TIMEOUT = 60
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9.+!_-]+)\s*$")


class RouterRefused(Exception):
    """The router cannot run here as rendered; the message names the variable and the fix."""


def _canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_installed(venv, requirements):
    """Whether each `name==version` requirement is installed in the virtualenv, read from its
    dist-info folders (what `pip list` reads) without starting pip, which takes seconds. A
    requirement of another form is never taken as installed: pip decides."""
    found = set()
    for path in glob.glob(os.path.join(venv, "lib*", "python*", "site-packages",
                                       "*.dist-info")):
        name, _, version = os.path.basename(path)[:-len(".dist-info")].partition("-")
        found.add((_canonical(name), version))
    for requirement in requirements:
        pin = _PIN.match(requirement)
        if not pin or (_canonical(pin.group(1)), pin.group(2)) not in found:
            return False
    return os.path.exists(os.path.join(venv, "bin", "python"))


def install_needed(install):
    """pip installs: whether the pinned release is missing from the router's virtualenv."""
    return install["mode"] == "pip" and not pinned_installed(
        install["venv"] or os.path.dirname(os.path.dirname(install["router_python"])),
        install["requirements"])


def refuse_missing_python(install, version):
    if install["mode"] == "existing" and not os.path.exists(install["router_python"]):
        raise RouterRefused(
            "sglang_router_python=%s does not exist on the router host. Fix: point it at the "
            "Python of an environment with sglang-router %s, or use "
            "sglang_router_install_mode: pip" % (install["python"] or install["router_python"],
                                                 version))


def flag_variable(message, flag_variables):
    """The sglang_router_* variable behind the first router option a refusal names."""
    for flag in re.findall(r"--[a-z0-9-]+", message):
        if flag in flag_variables:
            return flag_variables[flag]
    return "sglang_router_extra_args"


def refusal(r, message):
    """The installed router's refusal of the rendered command, naming the variable behind it."""
    variable = flag_variable(message, r["flag_variables"])
    return ("%s: sglang-router %s on this host refused the rendered command: %s. Fix: correct "
            "%s (`%s/sglang-router launch --help` lists what this release takes), or pin the "
            "release whose options you use with sglang_router_version"
            % (variable, r["version"],
               re.sub(r"^SGLang rejected the rendered arguments: ", "", message), variable,
               os.path.dirname(r["install"]["router_python"])))


def digest_of(r):
    """The digest the service records for the rendered files (script, env file, unit, in that
    order), computed from their content as the service computes it from the files on disk."""
    files = dict((f["path"], f["content"].encode("utf-8"))
                 for f in list(r["files"]) + list(r["secret_files"]))
    return service_mod.content_digest([(path, files[path]) for path in config_files(r)])


def config_files(r):
    script, env = r["service"]["script"], r["secret_files"][0]["path"]
    rest = [f["path"] for f in r["files"] if f["path"] != script]
    return [script, env] + rest


def service_status(svc):
    """The router's service and its status; a running router is read from the service's record
    (the common case of a re-run: no scan of the host's processes)."""
    try:
        service = service_mod.service_of(svc)
        if svc["manager"] == "supervisor" and service.running():
            state = read_json(svc["state_file"]) or {}
            return service, {"running": True, "members": [], "pid": state.get("pid"),
                             "digest": state.get("digest"),
                             "config_hash": state.get("config_hash"), "foreign": []}
        return service, service.status()
    except service_mod.ServiceError as exc:
        raise RouterRefused(str(exc)) from exc


def check_args(r, files_current, check_mode, result):
    """The installed router parses the rendered command when the files changed or the router
    (its parser's code) did since it last accepted it. Returns whether a record is to be
    written. In check mode a router not installed yet is not asked."""
    python, parser, args = r["install"]["router_python"], r["args_parser"], r["args"]
    if check_mode and not os.path.exists(python):
        result["args_parsed"] = "skipped"
        return False
    if files_current and r["argcheck_record"]:
        record = args_record(python, parser, args)
        stored = read_json(r["argcheck_record"]) or {}
        if record and stored.get("record") == record:
            result["args_parsed"] = "before"
            return False
    rejected = parse_args(python, parser, args, PARSE_TIMEOUT)
    if rejected is not None:
        raise RouterRefused(refusal(r, rejected[0]))
    result["args_parsed"] = "accepted"
    return bool(r["argcheck_record"]) and not check_mode


def refuse_vanished_secret(r):
    """A key the router last started with that resolves to nothing now would restart it open:
    refused before anything changes (the servers' check), unless dropped on purpose."""
    if not r.get("secrets") or not r.get("running_spec_file"):
        return
    refusal = vanished_secret(r["secrets"], read_json(r["running_spec_file"]) or {},
                              "sglang_router_drop_secrets", what="the router",
                              whom="the router")
    if refusal:
        raise RouterRefused(refusal)


def started_record(r):
    """What the host keeps of a start (beside the service's state file): the configuration
    and its keys' names and fingerprints, never their values."""
    if not r.get("secrets"):
        return None
    return {"config_hash": r["config_hash"], "secret_env_names": r["secrets"]["names"],
            "secret_fingerprints": r["secrets"]["fingerprints"]}


def start_blockers(r, members):
    svc = r["service"]
    return server_start_blockers(dict(log_file=svc["log_file"], state_file=svc["state_file"],
                                      shm_dir=None, min_free_mb=64, host="127.0.0.1",
                                      port=None, group_markers=[], model_path=None),
                                 [m["pid"] for m in members or []])


def restart(r, service, status, digest):
    """Stop what runs of the router (when anything does), then start it from the new files."""
    svc = r["service"]
    blockers = start_blockers(r, status["members"])
    if blockers:
        kept = (" Nothing was stopped: the running server (pid %s, config %s) keeps serving."
                % (status["pid"], status["config_hash"] or "unrecorded")
                if status["running"] else " Nothing was started.")
        raise RouterRefused("%s: the new server cannot start here: %s.%s"
                            % (r["marker"], "; ".join(blockers), kept))
    try:
        if status["running"] or status["members"]:
            report = service.stop(svc["stop_timeout"])
            if report["remaining"]:
                raise RouterRefused(
                    "processes of the deployment survived SIGKILL (D state?): %s; run "
                    "playbooks/recover.yml, or reboot the node" % ", ".join(
                        "%d(%s)" % (x["pid"], x["state"]) for x in report["remaining"]))
        return service.start(digest, r["config_hash"], launch_spec=started_record(r),
                             running_spec_file=r.get("running_spec_file"))
    except (service_mod.ServiceError, OSError, IOError) as exc:
        raise RouterRefused("could not start %s: %s" % (r["marker"], exc)) from exc


def wait_live(url, timeout, interval=0.2, clock=time.monotonic, sleep=time.sleep):
    """Poll the router's /liveness until it answers 200; the last answer when it never did."""
    deadline = clock() + timeout
    while True:
        try:
            status, body = http("GET", url, timeout=5)
            last = "%s %s" % (status, str(body)[:200])
        except RouterUnreachable as exc:
            status, last = None, str(exc)
        if status == 200:
            return None
        if clock() >= deadline:
            return last
        sleep(interval)


def converge(p, check_mode, warn, want_diff=False):
    """The router's host brought to the rendered router in one pass; `p` holds the module's
    parameters. Returns the module's result."""
    r = p["router"]
    refuse_missing_python(r["install"], r["version"])
    refuse_vanished_secret(r)
    result = dict(changed=False, action="none", install_needed=install_needed(r["install"]))
    if result["install_needed"] and not p["after_install"]:
        return result  # the role's install step runs, then this module again
    try:
        actions, diffs = deployfiles.plan(r["folders"], deployfiles.to_write(
            r["files"], r["secret_files"]))
    except (deployfiles.DeployFilesError, OSError, IOError, ValueError) as exc:
        raise RouterRefused("cannot write the router's files: %s" % exc) from exc
    result["files_changed"] = [item["path"] for _, item in actions]
    if want_diff:
        result["diff"] = diffs
    service, status = service_status(dict(r["service"], marker=r["marker"]))
    for line in describe_foreign(status["foreign"], r["service"]["user"]):
        warn(line)
    record = check_args(r, not actions, check_mode, result)
    digest = digest_of(r)
    if status["running"] and status["digest"] == digest:
        action = "none"
    else:
        action = "restarted" if status["running"] else "started"
    result.update(changed=bool(actions) or action != "none", action=action, pid=status["pid"],
                  config_hash=status["config_hash"] if action == "none" else r["config_hash"])
    if check_mode:
        for line in start_blockers(r, status["members"]) if action != "none" else []:
            warn("the start would fail: %s" % line)
        return result
    _apply(r, actions, record)
    if action != "none":
        result["pid"] = restart(r, service, status, digest)
    late = wait_live(r["liveness_url"], p["wait_timeout"])
    if late is not None:
        raise RouterRefused(
            "the router at %s did not answer within %g s (last: %s). Fix: read its log, %s"
            % (r["liveness_url"], p["wait_timeout"], late, r["service"]["log_file"]))
    if action == "none" and not actions:
        _visit(p["host_name"], r, result)
    else:
        result["workers"] = listed_workers(r)
    result["msg"] = "%s: router %s at %s (sglang-router %s, config %s, pid %s)%s" % (
        p["host_name"], "running" if action == "none" else action, r["url"] or r["admin_url"],
        r["version"],
        r["config_hash"], result["pid"],
        "" if action == "none" else "; it starts with no workers: each ready server joins it")
    return result


def _visit(name, r, result):
    """A router that runs unchanged: the report's one visit (its workers and one request
    answered through it) made now, beside the check. The report then shows it without asking
    again when nothing in front of the router changed since (the servers unchanged, no
    membership called). A router without a healthy worker is not asked a request."""
    seen = ask(r["admin_url"], r["admin_key"] or None, r["api_key"] or None, REPORT_TIMEOUT,
               request=lambda workers: any(w.get("is_healthy") for w in workers))
    result["workers"] = None if seen["workers_error"] else _workers_of(seen["workers"])
    if seen["status"] == 200:
        router = {"name": name, "url": r["url"] or r["admin_url"], "version": r["version"],
                  "policy": r["policy"]}
        result["report"] = report_line(router, seen)
        # The router's verdict when that report stands: its row in the run's table says it.
        result["gate"] = router_verdict(router, seen)


def listed_workers(r):
    """The workers the router lists now ({url, healthy}), or None when it cannot say: the
    membership of a server that has not changed since follows from it without asking again."""
    if not r["admin_url"]:
        return None
    try:
        status, body = http("GET", r["admin_url"] + "/workers", r["admin_key"] or None,
                            timeout=10)
    except RouterUnreachable:
        return None
    if status != 200 or not isinstance(body, dict) or not isinstance(body.get("workers"), list):
        return None
    return _workers_of(body["workers"])


def _workers_of(listed):
    """The router's /workers entries as the membership reads them: {url, healthy}."""
    return [{"url": str(w.get("url") or "").rstrip("/"), "healthy": bool(w.get("is_healthy"))}
            for w in listed if isinstance(w, dict)]


def _apply(r, actions, record):
    try:
        deployfiles.apply(actions)
        if record:
            record_args_checked(r["argcheck_record"], args_record(
                r["install"]["router_python"], r["args_parser"], r["args"]))
    except (deployfiles.DeployFilesError, OSError, IOError, ValueError) as exc:
        raise RouterRefused("cannot write the router's files: %s" % exc) from exc
