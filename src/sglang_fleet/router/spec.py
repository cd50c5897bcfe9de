"""The RouterSpec: everything needed to run SGLang's router (sglang-router) on its host, built in
this one place from the host's `sglang_router_*` variables.

Like the LaunchSpec of a server, it is a plain dict (argv with secret references, environment,
service settings, paths, a deployment marker, a config hash) plus every error at once, each
naming the host, the variable, its value and the fix. The router's options come from the pinned
release's catalogue (router_catalogue), so a typo in a policy name or an option the release does
not have is refused here, on the controller, before anything is installed.

The router starts with no workers: membership is the gate's (ready servers are added through the
router's worker API, failed ones removed), so `--worker-urls` and the options that discover
workers by themselves are refused.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from typing import Any

from sglang_fleet.known.catalogue import Catalogue
from sglang_fleet.launch.render import unit_path_problem
from sglang_fleet.launch.spec import MARKER_VAR, config_hash, is_loopback, secret_fingerprint
from sglang_fleet.router.catalogue import known_versions, router_catalogue
from sglang_fleet.settings import router as router_settings
from sglang_fleet.settings.kinds import TOKEN68, Setting, SettingsTable, coerce, unknown_variables
from sglang_fleet.settings.problems import Problems, describe_value
from sglang_fleet.settings.router import BY_NAME, BY_VARIABLE, PREFIX, TABLE

API_KEY_VAR = BY_NAME["api_key"].env
CONTROL_PLANE_KEY_VAR = str(BY_NAME["control_plane_api_keys"].env).replace("*", "{}")
# Each secret setting and its env file variables (the control-plane keys: one per key).
SECRET_ENV = TABLE.secret_env
SECRET_ARG = "@env:"  # an argv word naming an env-file variable, replaced at exec time
MASK = "********"
KEY_MIN_LENGTH = 16
_KEY_FIELD = re.compile(r"^[^:\n\r\x00]{1,128}$")
# Options that would give the router workers of its own: membership is the gate's.
_MEMBERSHIP_FLAGS = {
    "--worker-urls": "the router starts with no workers; the gate adds each server once it is "
                     "ready",
    "--service-discovery": "membership follows the gate's verdicts, not Kubernetes",
    "--prefill": "the gate adds each prefill server once it is ready, with its bootstrap port "
                 "(sglang_router_pd_disaggregation: true puts the router in PD mode)",
    "--decode": "the gate adds each decode server once it is ready (sglang_router_pd_"
                "disaggregation: true puts the router in PD mode)",
    "--mini-lb": "MiniLB is the router's debugging stand-in",
}

# The launcher: sglang-router's own CLI entry point, given the secrets from the environment.
LAUNCHER = (
    "import os, sys\n"
    "from sglang_router.cli import main\n"
    "# Secrets arrive as names of variables of the 0600 env file, so no command line shows "
    "them.\n"
    f"main([os.environ[a[{len(SECRET_ARG)}:]] if a.startswith({SECRET_ARG!r}) else a "
    "for a in sys.argv[1:]])\n"
)


def _table() -> SettingsTable:
    """The router role's settings, read when used (a test may add a row)."""
    return router_settings.TABLE


def _choice(s: Setting, value: Any, cat: Catalogue, p: Problems) -> None:
    choices = cat.by_flag[s.flag].choices if s.flag in cat.by_flag else None
    if choices is None or value in choices:
        return
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    p.error(s.variable, value, f"is not one of sglang-router {cat.version.split()[-1]}'s "
            f"choices for {s.flag}", (f"did you mean {close[0]!r}? " if close else "")
            + f"valid: {', '.join(str(c) for c in choices)}")


def _check_key(variable: str, key: Any, p: Problems, where: str = "") -> None:
    problem = None
    if not isinstance(key, str) or not key:
        problem = "is empty or not a string"
    elif len(key) < KEY_MIN_LENGTH:
        problem = f"is {len(key)} characters long: too short to be a secret"
    elif not TOKEN68.match(key):
        problem = "has characters an HTTP bearer token cannot carry (spaces, quotes, ...)"
    if problem:
        p.error(variable, None, f"{where}{problem}",
                f"use a random key of at least {KEY_MIN_LENGTH} characters, e.g. `openssl rand "
                "-hex 24`, kept in ansible-vault", described="<secret>")


def _control_plane_keys(keys: list[Any], p: Problems) -> list[dict[str, str]]:
    var = PREFIX + "control_plane_api_keys"
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for i, entry in enumerate(keys):
        where = f"item {i}: "
        if not isinstance(entry, dict) or set(entry) - {"id", "name", "role", "key"}:
            p.error(var, None, f"{where}must be a mapping of id, name, role and key",
                    "e.g. {id: fleet, name: sglang-fleet, role: admin, key: <from vault>}",
                    described="<secret>")
            continue
        ok = True
        for field in ("id", "name"):
            text = entry.get(field)
            if not isinstance(text, str) or not _KEY_FIELD.match(text):
                p.error(var, None, f"{where}{field}={describe_value(text)} must be 1-128 "
                        "characters without ':' (the router reads 'id:name:role:key')",
                        f"rename the {field}", described="<secret>")
                ok = False
        role = entry.get("role")
        if role not in ("admin", "user"):
            p.error(var, None, f"{where}role={describe_value(role)} is not admin or user",
                    "set role: admin (the worker API) or user (inference only)",
                    described="<secret>")
            ok = False
        if entry.get("id") in seen:
            p.error(var, None, f"{where}id {entry.get('id')!r} is used twice",
                    "give each key its own id", described="<secret>")
            ok = False
        seen.add(str(entry.get("id")))
        before = len(p.errors)
        _check_key(var, entry.get("key"), p, where)
        if ok and len(p.errors) == before:
            out.append({k: str(entry[k]) for k in ("id", "name", "role", "key")})
    return out


def _check_extra_args(tokens: list[str], cat: Catalogue, p: Problems) -> None:
    var = PREFIX + "extra_args"
    check = cat.check_args(tokens)
    for problem in check.problems:
        fix = problem.fix.replace("`sglang serve --help` for SGLang router",
                                  "`sglang-router launch --help` of sglang-router")
        p.error(var, tokens, problem.problem, fix)
    owned = {cat.by_flag[s.flag].dest: s for s in _table()
             if s.flag and s.flag in cat.by_flag}
    for dest, flag in check.dests.items():
        if flag in _MEMBERSHIP_FLAGS:
            p.error(var, tokens, f"{flag}: {_MEMBERSHIP_FLAGS[flag]}",
                    "remove it: ready servers join the router through the gate")
        elif dest in owned:
            setting = owned[dest]
            p.error(var, None if setting.secret else tokens,
                    f"{flag} is set by {setting.variable}",
                    f"set {setting.variable} instead", described="<hidden>" if setting.secret
                    else None)
    p.warnings.extend(check.warnings)


def _connect_host(listen: str) -> str:
    """The address the router host itself reaches a listener on."""
    if listen in ("0.0.0.0", ""):
        return "127.0.0.1"
    if listen == "::":
        return "[::1]"
    return _url_host(listen)


def _url_host(host: str) -> str:
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def worker_url(server_spec: dict[str, Any], address: str, override: str | None = None) -> str:
    """The URL a router reaches a server at: the override, else its listen address (or the
    node's address when it listens on every address) and its port."""
    if override:
        return str(override).rstrip("/")
    listen = str(server_spec.get("settings", {}).get("sglang_server_host") or "127.0.0.1")
    host = address if listen in ("0.0.0.0", "::", "") else listen
    return f"http://{_url_host(host)}:{server_spec['http']['port']}"


def _pinned_catalogue(version: Any, p: Problems) -> Catalogue | None:
    """The pinned router release's catalogue: shipped, cached on this controller, or read from
    the release's package on first use (router.release); one that cannot be is refused."""
    from sglang_fleet.known.refenv import RefEnvError
    from sglang_fleet.router import release

    pin = (f"pin one of: {', '.join(reversed(known_versions()))}, or any release from "
           f"{release.MIN_SUPPORTED} on")
    if not isinstance(version, str) or not version:
        p.error(PREFIX + "version", version, "must name an sglang-router release", pin)
        return None
    problem = release.name_problem(version)
    if problem:
        p.error(PREFIX + "version", version, problem, pin)
        return None
    if version not in known_versions():
        try:
            release.ensure_catalogue(version)
        except RefEnvError as exc:
            p.error(PREFIX + "version", version, str(exc),
                    f"pin a release this controller can read, or prepare it with "
                    f"`sglang-fleet release add --router {version} --wheelhouse DIR`")
            return None
    return router_catalogue(version)


def build_router_spec(settings: dict[str, Any], host: str, address: str | None = None
                      ) -> dict[str, Any]:
    """Build and validate one router host's RouterSpec. `settings` holds the host's
    sglang_router_* variables (missing ones take the table's defaults); `address` is how other
    machines reach the host (its ansible_host). Returns {"ok", "errors", "warnings", "spec"}."""
    p = Problems(host, prefix="")
    table = _table()
    unknown_variables(settings, table, p)
    v: dict[str, Any] = {}
    for s in table:
        v[s.name] = coerce(s, settings.get(s.variable, s.default), p)
    version = v["version"]
    cat = _pinned_catalogue(version, p)
    if cat is None:
        return _result(p, None)
    for s in table:
        if s.flag in cat.by_flag and cat.by_flag[s.flag].choices and v[s.name] is not None:
            _choice(s, v[s.name], cat, p)
    if v["api_key"]:
        _check_key(PREFIX + "api_key", v["api_key"], p)
    cp_keys = _control_plane_keys(v["control_plane_api_keys"] or [], p)
    _check_drops(v["drop_secrets"] or [], p)
    _check_extra_args(v["extra_args"] or [], cat, p)
    if v["port"] is not None and v["port"] == v["prometheus_port"]:
        p.error(PREFIX + "prometheus_port", v["prometheus_port"], "is the router's own port",
                "give the Prometheus endpoint a port of its own, e.g. 29000")
    grace, stop = v["shutdown_grace_period_secs"], v["stop_timeout"]
    if grace is not None and stop is not None and stop <= grace:
        p.error(PREFIX + "stop_timeout", stop, f"is not above sglang_router_shutdown_grace_"
                f"period_secs ({grace}): the router's own drain would be cut by SIGKILL",
                f"set sglang_router_stop_timeout to at least {grace + 10}")
    endpoint = v["health_check_endpoint"]
    if endpoint is not None and not endpoint.startswith("/"):
        p.error(PREFIX + "health_check_endpoint", endpoint, "must be a path",
                "e.g. /health (SGLang's)")
    if None not in (v["retry_initial_backoff_ms"], v["retry_max_backoff_ms"]) and \
            v["retry_max_backoff_ms"] < v["retry_initial_backoff_ms"]:
        p.error(PREFIX + "retry_max_backoff_ms", v["retry_max_backoff_ms"], "is below "
                f"sglang_router_retry_initial_backoff_ms ({v['retry_initial_backoff_ms']})",
                "raise it, or lower the initial backoff")
    for name in ("root", "python", "venv"):
        if v[name] and not str(v[name]).startswith("/"):
            example = BY_VARIABLE[PREFIX + name].default or "/opt/sglang-router/venv"
            p.error(PREFIX + name, v[name], "must be an absolute path", f"e.g. {example}")
    unit_problem = unit_path_problem(str(v["root"] or "")) \
        if v["service_manager"] == "systemd" else None
    if unit_problem:
        p.error(PREFIX + "root", v["root"], unit_problem, "choose a root without quotes or "
                "backslashes (spaces, '$', ';' and '%' are fine: the unit escapes them), or "
                "set sglang_router_service_manager: supervisor")
    if v["worker_url"] and not re.match(r"^https?://", v["worker_url"]):
        p.error(PREFIX + "worker_url", v["worker_url"], "must be an http:// or https:// URL",
                "e.g. http://10.0.0.11:30000")
    _check_exposure(v, cp_keys, p)
    _warn_pd_breaker(v, p)
    if p.errors:
        return _result(p, None)
    return _result(p, _assemble(v, cat, cp_keys, host, address or host))


def build_router_identity(settings: dict[str, Any], host: str, address: str | None = None
                          ) -> dict[str, Any]:
    """The router's identity for a stop, or for a server leaving it: its name, marker, paths,
    service and URLs, which no secret setting changes. Its settings are built whole when they
    can be; when only the secrets are refused (a key unset, too short), it is built again
    without them, and `refused` lists why: a broken key never keeps an operator from stopping
    a fleet. Returns build_router_spec's answer, plus `refused`."""
    built = build_router_spec(settings, host, address)
    if built["ok"]:
        return {**built, "refused": []}
    secrets = {s.variable for s in _table() if s.secret}
    bare = {k: v for k, v in settings.items() if k not in secrets}
    bare[PREFIX + "allow_unauthenticated"] = True  # the identity serves no one
    identity = build_router_spec(bare, host, address)
    if not identity["ok"]:
        return {**built, "refused": built["errors"]}
    return {**identity, "refused": built["errors"]}


def _warn_pd_breaker(v: dict[str, Any], p: Problems) -> None:
    """In PD mode the router charges a request's failure to its prefill and its decode alike
    (sglang-router 0.3.2, measured: bench/zero_drop.py --pd --api chat). One decode that dies
    under OpenAI-API streams or non-streamed requests, which wait on their prefill, then opens
    every prefill's circuit, and the router refuses all traffic until they close."""
    if not v["pd_disaggregation"]:
        return
    if v["disable_circuit_breaker"]:
        _warn_pd_decode_policy(v, p)
        return
    p.warn("sglang_router_pd_disaggregation with the circuit breaker on: the router "
           "charges a failed request to both its prefill and its decode, so one decode "
           "that dies with requests in flight can open every prefill's circuit and stop "
           "all traffic until they close. Set sglang_router_disable_circuit_breaker: "
           "true, and give the decodes a policy whose retries move to another decode "
           f"({DECODE_POLICY_FIX}); the fleet's gate and the router's health checks take "
           "failed servers out (docs/disaggregation.md)")


# What the PD warnings ask for: a decode policy whose retries leave a dead decode.
DECODE_POLICY_FIX = "sglang_router_extra_args: ['--decode-policy', 'round_robin']"


def decode_policy(v: dict[str, Any]) -> str:
    """The policy the router gives its decodes: --decode-policy among the extra arguments,
    else the main policy (sglang-router 0.3.2's router_args: "If not specified, uses the main
    policy")."""
    extra = [str(a) for a in v["extra_args"] or []]
    for i, arg in enumerate(extra):
        if arg == "--decode-policy" and i + 1 < len(extra):
            return extra[i + 1]
        if arg.startswith("--decode-policy="):
            return arg.partition("=")[2]
    return str(v["policy"])


def _warn_pd_decode_policy(v: dict[str, Any], p: Problems) -> None:
    """Without the breaker, a retry is what moves a request off a dead decode, and under
    cache_aware every retry of a request goes to the decode it chose first (measured with
    sglang-router 0.3.2: bench/zero_drop.py --pd --api chat, docs/disaggregation.md)."""
    if decode_policy(v) != "cache_aware":
        return
    p.warn("sglang_router_pd_disaggregation with the decodes on the cache_aware policy "
           "(sglang_router_policy, and no --decode-policy in sglang_router_extra_args): the "
           "router sends every retry of a request to the decode it chose first, so the "
           "requests it pairs with a decode that died keep failing until its health checks "
           "take that decode out. Give the decodes a policy whose retries move to another "
           f"decode ({DECODE_POLICY_FIX}) (docs/disaggregation.md)")


def _check_drops(names: list[str], p: Problems) -> None:
    secrets = _table().secret_env
    for name in names:
        if name not in secrets:
            p.error(PREFIX + "drop_secrets", name, "is not a secret setting",
                    f"name one of: {', '.join(secrets)}")


def _check_exposure(v: dict[str, Any], cp_keys: list[dict[str, str]], p: Problems) -> None:
    """A router reachable beyond its host serves anyone, and lets anyone change its workers,
    unless it has keys: refused unless the inventory says it is meant."""
    if v["allow_unauthenticated"] or v["host"] is None or is_loopback(v["host"]):
        return
    where = f"the router listens on {v['host']} (sglang_router_host)"
    fix = ("from ansible-vault, or the controller's environment: check that the variable it "
           "reads is set; or serve openly on purpose with "
           "sglang_router_allow_unauthenticated: true")
    if not v["api_key"]:
        p.error(PREFIX + "api_key", None, f"is empty while {where}: any client that reaches it "
                "is served", f"set sglang_router_api_key ({fix})", described="<empty>")
    if not cp_keys:
        p.error(PREFIX + "control_plane_api_keys", None, f"is empty while {where}: anyone who "
                "reaches it can add and remove workers",
                f"set an admin key in sglang_router_control_plane_api_keys ({fix})",
                described="<empty>")


def _assemble(v: dict[str, Any], cat: Catalogue, cp_keys: list[dict[str, str]], host: str,
              address: str) -> dict[str, Any]:
    name = f"sglang-router-{v['port']}"
    root = v["root"].rstrip("/")
    venv = v["venv"] or f"{root}/venv"
    router_python = f"{venv}/bin/python" if v["install_mode"] == "pip" else v["python"]
    table = _table()
    args, masked, secret_names = _render_settings(v, table)
    if cp_keys:
        args.append("--control-plane-api-keys")
        masked.append("--control-plane-api-keys")
        for i, key in enumerate(cp_keys):
            var = CONTROL_PLANE_KEY_VAR.format(i)
            secret_names.append(var)
            args.append({"env": var})
            # id, name and role are not secret: the router's own parser checks their format.
            masked.append(f"{key['id']}:{key['name']}:{key['role']}:{MASK}")
    args += v["extra_args"]
    masked += v["extra_args"]
    marker = f"{host}:{name}"
    env = {MARKER_VAR: marker, "SPT_NOENV": "1"}
    argv = [router_python, "-c", LAUNCHER, "launch", *args]
    service = {"manager": v["service_manager"], "unit_name": f"{name}.service",
               "stop_timeout": v["stop_timeout"], "user": v["user"]}
    core = {"argv": argv, "env": env, "secret_env_names": secret_names, "service": service,
            "version": v["version"]}
    chash = config_hash(core)
    env["SGLANG_FLEET_CONFIG"] = chash
    listen = v["host"]
    client_host = _url_host(address) if listen in ("0.0.0.0", "::") else _url_host(listen)
    return {
        "host": host,
        "name": name,
        "marker": marker,
        "config_hash": chash,
        "version": v["version"],
        "argv": argv,
        "router_args": ["launch", *masked],
        "env": env,
        "secret_env_names": secret_names,
        # Fingerprints only: the router's host refuses a start that would drop a key the router
        # last started with (one that resolved to nothing), unless drop_secrets names it.
        "secret_fingerprints": _fingerprints(v, table, cp_keys),
        "secret_variables": [[env, variable] for variable, env in table.secret_env.items()],
        "secret_drops": [table.secret_env[name] for name in v["drop_secrets"] or []],
        "service": service,
        "paths": {
            "root": root, "conf_dir": f"{root}/conf", "run_dir": f"{root}/run",
            "log_dir": f"{root}/logs", "venv": venv,
            "script": f"{root}/conf/{name}.launch.sh", "env_file": f"{root}/conf/{name}.env",
            "pid_file": f"{root}/run/{name}.pid", "log_file": f"{root}/logs/{name}.log",
            "running_spec": f"{root}/run/{name}.running-spec.json",
            "unit_file": (f"/etc/systemd/system/{name}.service"
                          if v["service_manager"] == "systemd" else None),
        },
        "install": {"mode": v["install_mode"], "python": v["python"],
                    "router_python": router_python,
                    "pip_requirements": [f"{v['pip_package']}=={v['version']}"]},
        "url": (v["url"] or f"http://{client_host}:{v['port']}").rstrip("/"),
        "admin_url": f"http://{_connect_host(listen)}:{v['port']}",
        "metrics_url": f"http://{_connect_host(v['prometheus_host'])}:{v['prometheus_port']}"
                       "/metrics",
        "needs_client_key": bool(v["api_key"]),
        "has_admin_key": any(k["role"] == "admin" for k in cp_keys),
        "policy": v["policy"],
        "membership": {"workers_group": v["workers_group"], "join_timeout": v["join_timeout"],
                       "drain_timeout": v["drain_timeout"],
                       "drain_poll_interval": v["drain_poll_interval"]},
        "settings": {s.variable: v[s.name] for s in table if not s.secret},
    }


def _result(p: Problems, spec: dict[str, Any] | None) -> dict[str, Any]:
    return {"ok": not p.errors, "errors": [str(e) for e in p.errors],
            "warnings": p.warnings, "spec": spec}


def _render_settings(v: dict[str, Any], table: SettingsTable
                     ) -> tuple[list[Any], list[str], list[str]]:
    """The options the settings render, in table order: (argv words, the same masked, the env
    file variables they read). A secret option names its env file variable, never the value."""
    args: list[Any] = []
    masked: list[str] = []
    secret_names: list[str] = []
    for s in table:
        if s.render == "value":
            args += [s.flag, str(v[s.name])]
            masked += [s.flag, str(v[s.name])]
        elif s.render == "switch" and v[s.name]:
            args.append(s.flag)
            masked.append(s.flag)
        elif s.render == "secret" and v[s.name]:
            secret_names.append(str(s.env))
            args += [s.flag, {"env": s.env}]
            masked += [str(s.flag), MASK]
    return args, masked, secret_names


def _fingerprints(v: dict[str, Any], table: SettingsTable, cp_keys: list[dict[str, str]]
                  ) -> dict[str, str]:
    out = {str(s.env): secret_fingerprint(v[s.name]) for s in table
           if s.render == "secret" and v[s.name]}
    for i, key in enumerate(cp_keys):
        out[CONTROL_PLANE_KEY_VAR.format(i)] = secret_fingerprint(key["key"])
    return out


def router_secrets(values: dict[str, Any]) -> dict[str, str]:
    """The env file's secret values, by env file variable (the spec holds only the names):
    `values` maps each secret setting's variable to its value. A row whose env name ends in
    `*` holds a list: one variable per item."""
    out: dict[str, str] = {}
    for setting in _table():
        value = values.get(setting.variable)
        if not (setting.secret and setting.env and value):
            continue
        if setting.env.endswith("*"):
            for i, item in enumerate(value):
                out[setting.env.replace("*", str(i))] = _secret_item(item)
        else:
            out[setting.env] = str(value)
    return out


def _secret_item(item: Any) -> str:
    # The router's own format for a control-plane key: id:name:role:key.
    if isinstance(item, dict):
        return f"{item['id']}:{item['name']}:{item['role']}:{item['key']}"
    return str(item)


def admin_key(control_plane_keys: list[Any] | None) -> str:
    """The key the fleet manages membership with: the first admin key, else none."""
    for key in control_plane_keys or []:
        if isinstance(key, dict) and key.get("role") == "admin":
            return str(key.get("key") or "")
    return ""




def spec_json(spec: dict[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True)
