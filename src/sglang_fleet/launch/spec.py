"""The LaunchSpec: everything needed to start one server on one node, built in this one place.

Input is the host's `sglang_server_*` variables (role defaults already applied by Ansible, or
loaded from the role's defaults by tests); sglang_server_overrides win over them. The settings
table (sglang_fleet.settings.server) says what each variable is; the pinned release's flag
catalogue (sglang_fleet.known.catalogue) says what SGLang accepts. The builder runs in stages,
each returning a typed value: validate -> topology -> server command (argv, env, Rule facts) ->
paths -> gate.
Output is a plain dict (Ansible facts, the CLI and the simulator carry the same structure), plus
every error at once, each naming the host, the variable, its value and the fix.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from sglang_fleet.known import release_check
from sglang_fleet.known.catalogue import (
    Catalogue,
    ParseError,
    catalogue,
    catalogue_path,
    catalogue_source,
    known_versions,
)
from sglang_fleet.known.models import gpu_memory_bytes, known_model
from sglang_fleet.known.reviewed import (
    Release,
    nccl_did_you_mean,
    nccl_variable_names,
    release_of,
    sim_profile,
)
from sglang_fleet.known.rules import Rule, matching_rules
from sglang_fleet.known.sglang_checks import resolved
from sglang_fleet.known.sim_regress import RegressionError, parse_regress
from sglang_fleet.launch import clashes, envs, pd, seed
from sglang_fleet.launch.kernel_cache import kernel_cache_view
from sglang_fleet.launch.render import unit_path_problem
from sglang_fleet.launch.views import SCHEMA
from sglang_fleet.node.common.secrets import fingerprint, is_secret_name, mask_argv
from sglang_fleet.node.common.vocab import PHASES, default_windows
from sglang_fleet.node.gpu import modelfit
from sglang_fleet.node.health.stacks import FROZEN_SAMPLES
from sglang_fleet.settings import server as server_settings
from sglang_fleet.settings.kinds import TOKEN68, Setting, SettingsTable, coerce, unknown_variables
from sglang_fleet.settings.problems import Problems, SpecError, describe_value
from sglang_fleet.settings.server import (
    FACT_OF_SETTING,
    OUTPUT_FACTS,
    PREFIX,
    SECRET_ENV,
    SECRET_SETTINGS,
    compute_capability,
    owners_by_dest,
    rule_facts,
)

__all__ = ["API_KEY_VAR", "CONFIG_VAR", "FACT_OF_SETTING", "HF_TOKEN_VAR", "MARKER_VAR",
           "IDENTITY_SETTINGS", "OUTPUT_FACTS", "PREFIX", "SECRET_SETTINGS",
           "build_identity", "build_launch_spec", "config_hash",
           "group_consistency_errors", "public_settings", "secret_fingerprint"]

MARKER_VAR = "SGLANG_FLEET_DEPLOYMENT"
CONFIG_VAR = "SGLANG_FLEET_CONFIG"
API_KEY_VAR = SECRET_ENV[PREFIX + "api_key"]
HF_TOKEN_VAR = SECRET_ENV[PREFIX + "hf_token"]
API_KEY_MIN_LENGTH = 16

_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# NCCL takes words, numbers and comma lists; anything else is a typo or an injection.
_NCCL_VALUE = re.compile(r"[A-Za-z0-9_.,:/+-]{1,256}")
_DEPLOYMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def _table() -> SettingsTable:
    """The server role's settings, read when used (a test may add a row)."""
    return server_settings.TABLE


def public_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The sglang_server_* settings without the secrets: safe for facts, ledgers, reports."""
    secrets = _table().secret_variables
    return {k: v for k, v in settings.items()
            if k.startswith(PREFIX) and k not in secrets
            and k not in OUTPUT_FACTS and not k.startswith(PREFIX + "_")}


# ---- stage 1: validate -------------------------------------------------------------------

@dataclass(frozen=True)
class Validated:
    """Every setting, coerced to its type (short names), with the release it pins."""

    values: dict[str, Any]
    effective: dict[str, Any]  # the sglang_server_* settings with the overrides applied
    release: Release
    catalogue: Catalogue

    def __getitem__(self, name: str) -> Any:
        return self.values[name]


def validate(settings: dict[str, Any], p: Problems) -> Validated | None:
    table = _table()
    secrets = table.secret_variables
    unknown_variables(settings, table, p, outputs=OUTPUT_FACTS)
    overrides = settings.get(PREFIX + "overrides") or {}
    if not isinstance(overrides, dict):
        p.error("overrides", overrides, "must be a mapping of sglang_server_* variables",
                "e.g. {sglang_server_attention_backend: triton}")
        overrides = {}
    for name in overrides:
        if name in secrets:
            p.error("overrides", None, f"carries the secret {name}: a secret has one way in",
                    f"set {name} itself (encrypted with ansible-vault), never inside "
                    f"sglang_server_overrides", described=f"{{{name}: <secret>}}")
        elif name == PREFIX + "overrides":
            p.error("overrides", None, "contains sglang_server_overrides itself",
                    "list the variables to override directly", described="<nested>")
    unknown_variables({k: v for k, v in overrides.items() if k not in secrets}, table, p,
                      " (inside sglang_server_overrides)", OUTPUT_FACTS)
    effective = dict(settings)
    effective.update({k: v for k, v in overrides.items()
                      if k in table.by_variable and k not in secrets})
    effective[PREFIX + "overrides"] = overrides

    version = effective.get(PREFIX + "version")
    cat = _pinned_catalogue(version, p)
    if cat is None:
        return None
    release, note = release_of(cat.version, cat.by_flag)
    if note:
        p.warn(note)

    values: dict[str, Any] = {}
    for setting in table:
        raw = effective.get(setting.variable, setting.default)
        values[setting.name] = coerce(setting, raw, p)
        if setting.catalogue_choices and values[setting.name] is not None:
            _catalogue_choice(setting, values[setting.name], cat, effective, p)
    _check_secrets(values, cat, p)
    _check_exposure(values, p)
    _check_sim_regress(values, p)
    return Validated(values, effective, release, cat)


def _check_sim_regress(values: dict[str, Any], p: Problems) -> None:
    """The simulator's SGLANG_SIM_REGRESS, refused here with the parse the simulator runs."""
    text = values.get("sim_regress")
    if text:
        try:
            parse_regress(text)
        except RegressionError as bad:
            p.error("sim_regress", text, bad.problem, bad.fix)


def _pinned_catalogue(version: Any, p: Problems) -> Catalogue | None:
    """The pinned release's catalogue: cached on this controller, or built from the release's
    package on first use (refenv); a release that cannot be built is refused, with why."""
    from sglang_fleet.known import refenv

    if not isinstance(version, str) or not version:
        p.error("version", version, "must name a SGLang release",
                f"pin one of: {', '.join(reversed(known_versions()))}, or any release from "
                f"{refenv.MIN_SUPPORTED} on")
        return None
    if version not in known_versions():
        try:
            refenv.ensure_catalogue(version)
        except refenv.RefEnvError as exc:
            p.error("version", version, str(exc),
                    f"pin a release this controller can build, or prepare it with "
                    f"`sglang-fleet release add {version} --wheelhouse DIR`")
            return None
    return catalogue(version)


def _catalogue_choice(setting: Setting, value: Any, cat: Catalogue, effective: dict[str, Any],
                      p: Problems) -> None:
    option = cat.by_flag.get(setting.flag or "")
    choices = option.choices if option else None
    if choices is None or value in choices or value == setting.omit:
        return
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    if close and setting.fact:
        # A suggestion a Rule refuses on this host is no fix: say so, and name the Rule's.
        raw = {s.name: effective.get(s.variable) for s in _table()}
        facts = {**rule_facts(raw), setting.fact: close[0]}
        allowed = effective.get(PREFIX + "allow_rules") or []
        refusing = [r for r in matching_rules(facts) if r.id not in allowed]
        if refusing:
            rule = refusing[0]
            hint = (f"{close[0]!r} is the closest, but rule {rule.id} refuses it on this "
                    f"hardware: set {rule.fix_variable}: {rule.fix_value!r}. ")
    p.error(setting.variable, value, f"is not one of SGLang {cat.version}'s choices for "
            f"{setting.flag}",
            f"{hint}valid: {', '.join(str(c) for c in choices)}"
            + ("; or null for SGLang's default" if setting.nullable else ""))


def _check_secrets(values: dict[str, Any], cat: Catalogue, p: Problems) -> None:
    key = values.get("api_key")
    if key:
        problem = None
        if len(key) < API_KEY_MIN_LENGTH:
            problem = f"is {len(key)} characters long: too short to keep out of logs safely"
        elif not TOKEN68.match(key):
            problem = "has characters an HTTP bearer token cannot carry (spaces, quotes, ...)"
        elif len(set(key)) < 8 or _in_sglang_vocabulary(key, cat):
            problem = "is too common a string to mask safely in SGLang's logs"
        if problem:
            p.error("api_key", None, problem,
                    f"use a random key of at least {API_KEY_MIN_LENGTH} characters, e.g. "
                    "`openssl rand -hex 24`, kept in ansible-vault", described="<secret>")
    secrets = _table().secret_variables
    for name in values.get("drop_secrets") or []:
        if name not in secrets:
            p.error("drop_secrets", name, "is not a secret setting",
                    f"name one of: {', '.join(secrets)}")
    token = values.get("hf_token")
    if token and not re.fullmatch(r"\S+", token):
        p.error("hf_token", None, "contains whitespace", "paste the token alone",
                described="<secret>")


def is_loopback(host: str | None) -> bool:
    if not host or host == "localhost":
        return bool(host)
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_exposure(values: dict[str, Any], p: Problems) -> None:
    """A server reachable beyond this machine answers anyone without a key: refused unless
    the inventory says it is meant."""
    host = values.get("host")
    if values.get("api_key") or values.get("allow_unauthenticated") or host is None \
            or is_loopback(host):
        return
    p.error("api_key", None, f"is empty while the server listens on {host} "
            "(sglang_server_host): anyone who reaches the port can use it",
            "set sglang_server_api_key (from ansible-vault, or the controller's environment: "
            "check that the variable it reads is set), or serve openly on purpose with "
            "sglang_server_allow_unauthenticated: true", described="<empty>")


def _in_sglang_vocabulary(key: str, cat: Catalogue) -> bool:
    lowered = key.lower()
    words = {w for o in cat.options for f in o.flags for w in (f.lstrip("-"), o.dest)}
    words |= {str(c) for o in cat.options for c in (o.choices or ())}
    return any(lowered in w.lower() for w in words)


# ---- stage 2: topology -------------------------------------------------------------------

@dataclass(frozen=True)
class Topology:
    group: str | None
    nnodes: int
    node_rank: int
    dist_init_addr: str | None
    gpus_per_node: int  # GPUs the server uses on each of its nodes

    @property
    def serves_http(self) -> bool:
        return self.node_rank == 0


def group_size_errors(v: Validated, members: list[str], p: Problems) -> None:
    """A group whose inventory holds fewer (or more) nodes than sglang_server_group_nodes
    says: a slice of the inventory, or a host gone, would deploy the server on fewer nodes."""
    declared = v["group_nodes"]
    if declared is None or declared == len(members):
        return
    if not v["group"]:
        p.error("group_nodes", declared, "a node count without a multi-node group", "set "
                "sglang_server_group to the group's inventory name, or unset group_nodes")
        return
    p.error("group_nodes", declared,
            f"this inventory holds {len(members)} of group {v['group']}'s nodes "
            f"({', '.join(members)}): the others are not in it (a slice of the inventory, or "
            f"a host gone from it), and a multi-node server is deployed, recovered and stopped "
            f"whole", "run with an inventory that holds the whole group (sglang-fleet plan "
            "--slices N writes limits that keep groups whole), or correct group_nodes")


def topology(v: Validated, host: str, members: list[str] | None, dist_host: str | None,
             p: Problems) -> Topology:
    nnodes, node_rank, addr = 1, 0, None
    group = v["group"]
    if group:
        members = list(members or [])
        if host not in members:
            p.error("group", group, f"host is not a member of inventory group {group!r}",
                    "add the host to that group or unset sglang_server_group")
        else:
            nnodes = len(members)
            explicit = v["node_rank"]
            node_rank = members.index(host) if explicit is None else explicit
            if not 0 <= node_rank < nnodes:
                p.error("node_rank", node_rank, f"must be in 0..{nnodes - 1} for a "
                        f"{nnodes}-node group", "unset it to derive ranks from group order")
        group_size_errors(v, members, p)
        if not dist_host:
            p.error("dist_init_host", dist_host, "no address for the group's rank 0",
                    "set sglang_server_dist_init_host or ansible_host on the first member")
        elif v["dist_init_port"]:
            addr = f"{dist_host}:{v['dist_init_port']}"
    elif v["node_rank"] is not None:
        p.error("node_rank", v["node_rank"], "a node rank without a multi-node group "
                "contradicts itself", "set sglang_server_group to the group's inventory "
                "name, or unset node_rank")
    if not group:
        group_size_errors(v, [], p)
    tp, dp, pp, gpus = v["tp"], v["dp"], v["pp"], v["gpu_count"]
    per_node = 0
    if tp and dp and pp and gpus:
        if (tp * pp) % nnodes:
            p.error("tp", tp, f"tp x pp = {tp * pp} is not divisible by the group's {nnodes} "
                    "nodes", f"use a multiple of {nnodes}")
        else:
            per_node = tp * pp // nnodes * dp
            if per_node > gpus:
                p.error("tp", tp, f"tp x pp x dp = {tp * pp * dp} needs {per_node} GPUs per "
                        f"node but sglang_server_gpu_count is {gpus} (nodes in group: "
                        f"{nnodes})", f"lower tp/pp/dp, or add nodes to sglang_server_group "
                        f"(tp x pp x dp <= {gpus * nnodes})")
            elif per_node < gpus:
                idle = f"GPU {per_node}" if gpus - per_node == 1 else \
                    f"GPUs {per_node}-{gpus - 1}"
                p.warn(f"tp x pp x dp uses {per_node} of {gpus} GPUs per node; idle: {idle} "
                       "(SGLang takes GPUs from --base-gpu-id, 0 unless set)")
    return Topology(group or None, nnodes, node_rank, addr, per_node)


# ---- stage 3: the server command ---------------------------------------------------------

@dataclass
class ServerCommand:
    args: list[Any] = field(default_factory=list)  # str, or {"env": NAME} for a secret
    env: dict[str, str] = field(default_factory=dict)
    secret_env_names: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    allowed_rules: list[str] = field(default_factory=list)
    # What the model must support: tp, pp, ep and the attention-DP size SGLang resolves.
    layout: dict[str, int] = field(default_factory=dict)
    # The command line as the pinned release's parser reads it (secrets as placeholders).
    parsed: dict[str, Any] = field(default_factory=dict)
    # What the pinned release itself is asked about this command line (release_check).
    release_case: dict[str, Any] | None = None


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _render_settings(v: Validated, topo: Topology, served: str) -> list[Any]:
    """The flags the settings render, in table order, named by the release's catalogue."""
    cat, release = v.catalogue, v.release
    args: list[Any] = []
    for s in _table():
        value = v[s.name]
        if s.render == "value" and value is not None and value != s.omit:
            args += [s.flag, str(value)]
        elif s.render == "switch" and value:
            args.append(s.flag)
        elif s.render == "secret" and value:
            # A reference: the option moves to the 0600 config file (config_file_options), so
            # its value never appears in the command line, the script, the spec, Ansible
            # output or the runner artifacts.
            args += [s.flag, {"env": s.env}]
        elif s.render != "custom":
            continue
        elif s.name == "served_model_name":
            args += [s.flag, served]
        elif s.name == "group" and topo.nnodes > 1:
            args += ["--nnodes", str(topo.nnodes), "--node-rank", str(topo.node_rank),
                     "--dist-init-addr", topo.dist_init_addr]
        elif s.name == "cuda_graph" and value is False:
            for flag, wanted in release.cuda_graph_disable.items():
                args += [flag, str(wanted)] if cat.by_flag[flag].takes_values else [flag]
        elif s.name == "cuda_graph_max_bs" and value is not None:
            args += [release.cuda_graph_max_bs_flag, str(value)]
    return args


def _check_extra_args(v: Validated, p: Problems) -> list[str]:
    """Each token of extra_args against the catalogue; options the settings own are refused,
    whatever alias spells them."""
    extra = v["extra_args"] or []
    cat = v.catalogue
    shown = mask_argv(extra)
    for token, display in zip(extra, shown, strict=True):
        if "\n" in token or "\x00" in token:
            p.error("extra_args", None, "an argument contains a newline or NUL byte",
                    "remove control characters", described=describe_value(display))
    check = cat.check_args(extra)
    owners = owners_by_dest(cat)
    for problem in check.problems:
        token = mask_argv(problem.token.split(" ", 1))
        p.error("extra_args", None, problem.problem, problem.fix,
                described=describe_value(" ".join(token)))
    secret_options = any(s.render == "secret" and v[s.name] for s in _table())
    for dest, flag in check.dests.items():
        owner = owners.get(dest)
        if dest == "config" and secret_options:
            # SGLang takes one --config file ("Multiple config files specified!").
            p.error("extra_args", None, f"{flag} names a config file, but the server's secret "
                    "options reach it through the toolkit's own --config file, and SGLang "
                    "takes only one", "give those options as flags in sglang_server_extra_args "
                    "instead", described=describe_value(flag))
        elif owner is not None:
            p.error("extra_args", None, f"{flag} sets SGLang's {dest}, which the toolkit "
                    f"renders from {owner.variable}", f"set {owner.variable} instead",
                    described=describe_value(flag))
    for warning in check.warnings:
        p.warn(warning)
    return extra


def _environment(v: Validated, p: Problems) -> dict[str, str]:
    env: dict[str, str] = {}
    known = nccl_variable_names()
    for name, value in (v["nccl_profile"] or {}).items():
        if not str(name).startswith("NCCL_"):
            p.error("nccl_profile", name, f"{name} is not an NCCL variable",
                    "move it to sglang_server_extra_env")
        elif name not in known:
            guess = nccl_did_you_mean(name)
            p.error("nccl_profile", name, f"{name} is not a known NCCL variable",
                    f"did you mean {guess}?" if guess else "check the NCCL environment docs")
        elif not _scalar(value) or not _NCCL_VALUE.fullmatch(_env_value(value)):
            p.error("nccl_profile", value, f"{name}={describe_value(value)} is not a plain "
                    "NCCL value", "use a word or number such as SYS, LL or 8")
        else:
            env[name] = _env_value(value)
    for name, value in (v["extra_env"] or {}).items():
        text = str(name)
        if not _ENV_NAME.match(text) or text.startswith("SGLANG_FLEET_"):
            p.error("extra_env", name, f"{describe_value(name)} is not a usable environment "
                    "variable name", "use UPPER_CASE names; the SGLANG_FLEET_* names are "
                    "reserved")
        elif text.startswith("NCCL_"):
            p.error("extra_env", name, f"{name} belongs in the NCCL profile",
                    "move it to sglang_server_nccl_profile")
        elif text in _table().secret_env.values() or is_secret_name(text):
            p.error("extra_env", name, f"{name} looks like a secret: a secret has one way in, "
                    "and extra_env is written into facts, ledgers and reports",
                    f"use the secret settings ({', '.join(_table().secret_variables)}), kept in "
                    "ansible-vault")
        elif not _scalar(value):
            p.error("extra_env", value, f"value of {name} must be a word, number or boolean",
                    "quote it as one string")
        elif text.startswith("SGLANG_") and v.catalogue.environment and \
                text not in v.catalogue.environment:
            close = difflib.get_close_matches(text, sorted(v.catalogue.environment), n=1)
            p.warn(f"sglang_server_extra_env: SGLang {v.catalogue.version} reads no {text}"
                   + (f"; did you mean {close[0]}?" if close else ""))
            env[text] = _env_value(value)
        elif "\n" in str(value) or "\x00" in str(value):
            p.error("extra_env", name, f"value of {name} contains a newline or NUL byte",
                    "remove control characters")
        else:
            env[name] = _env_value(value)
    return env


def _options_of_release(v: Validated, p: Problems) -> None:
    """A setting that is set, whose option the pinned release does not have."""
    if any(s.render == "secret" and v[s.name] for s in _table()) and \
            CONFIG_FLAG not in v.catalogue.by_flag:
        p.error("sglang_version", v.release.version, f"SGLang {v.release.version} has no "
                f"{CONFIG_FLAG}, through which the server's secret options reach it (never its "
                "command line)", "pin a release that has it, or unset the secret settings")
    for s in _table():
        if s.flag and v[s.name] and s.flag not in v.catalogue.by_flag:
            p.error(s.variable, None if s.secret else v[s.name], f"SGLang {v.release.version} "
                    f"has no {s.flag}", "pin a release that has it, or unset the setting",
                    described="<secret>" if s.secret else None)


def server_command(v: Validated, topo: Topology, host: str, served: str, p: Problems,
                   from_seed: list[str] | None = None) -> ServerCommand:
    cmd = ServerCommand()
    _options_of_release(v, p)
    clean = not p.errors
    cmd.args = _render_settings(v, topo, served) + list(from_seed or []) + \
        _check_extra_args(v, p)
    if from_seed and "load_format" in v.catalogue.check_args(v["extra_args"] or []).dests:
        p.error("extra_args", None, f"sets --load-format while {seed.VAR} loads the weights "
                f"from {v['weights_from_instance']} (--load-format {seed.LOAD_FORMAT})",
                "remove --load-format from extra_args, or unset the seed",
                described="<--load-format ...>")
    if clean and not p.errors:
        # The whole command line through SGLang's own parser, rebuilt from the catalogue.
        try:
            parsed = v.catalogue.parse([a if isinstance(a, str) else "<secret>"
                                        for a in cmd.args])
        except ParseError as exc:
            p.error("extra_args", None, f"SGLang {v.catalogue.version} refuses the command "
                    f"line: {exc}", "correct the flags named",
                    described="<the rendered command line>")
        else:
            cmd.parsed = vars(parsed)
            values = resolved(cmd.parsed)
            cmd.layout = {"tp": v["tp"], "pp": v["pp"], "ep": v["ep"],
                          "attn_dp": values.get("attn_dp_size", 1)}
            cmd.release_case = _release_case(v, cmd.args, p)
            _model_refusals(v, cmd.layout, p)
    cmd.env = _environment(v, p)
    cmd.secret_env_names = [s.env for s in _table() if s.secret and s.env and v[s.name]]
    cmd.facts = rule_facts(v.values, v.release)
    allowed = v["allow_rules"] or []
    matched = matching_rules(cmd.facts)
    for rule in matched:
        if rule.id in allowed:
            p.warn(f"deploying despite {rule.id} (allowed by sglang_server_allow_rules)")
        else:
            _refuse_rule(rule, v, p)
    cmd.allowed_rules = [r.id for r in matched]
    return cmd


def _release_case(v: Validated, args: list[Any], p: Problems) -> dict[str, Any] | None:
    """The question the pinned release answers about this command line (release_check): the
    rendered arguments, the facts the toolkit has for what only the node knows, and which
    inventory variable set each of SGLang's options."""
    owners = owners_by_dest(v.catalogue)
    words = [a if isinstance(a, str) else release_check.SECRET_PLACEHOLDER for a in args]
    sources: dict[str, list[Any]] = {}
    for dest in v.catalogue.check_args(words).dests:
        variable, value = _refused_by(v, (dest,), owners)
        secret = variable in _table().secret_variables
        sources[dest] = [PREFIX + variable if not variable.startswith(PREFIX) else variable,
                         "<secret>" if secret else describe_value(value)]
    try:
        model = release_check.model_config(v["model_path"], v["model_config"])
    except ValueError as exc:
        p.error("model_config", v["model_config"], str(exc), "point it at a copy of the "
                "model's config.json on the controller (the file or its folder), or unset it")
        return None
    return release_check.case_of(
        v.release.version, args, model, sources,
        gpu_memory_bytes(v["gpu_model"], v["gpu_memory_gb"]),
        compute_capability(v["gpu_compute_capability"]))


def _model_refusals(v: Validated, layout: dict[str, int], p: Problems) -> None:
    """What a model the controller knows refuses of this layout (module_utils/gpu/modelfit, the
    node check's own checks), before any node is touched. Other models are the node
    check's, which reads the node's config.json."""
    model = known_model(v["model_path"])
    if model is None:
        return
    if model.attention != v["model_family"]:
        p.warn(f"sglang_server_model_family is {v['model_family']}, but {model.name} is an "
               f"{model.attention} model: Rules match on this setting; set "
               f"sglang_server_model_family: {model.attention}")
    found = modelfit.layout_problems(model.name, model.shape, layout)
    fit = modelfit.fit_problem(model.name, model.checkpoint_bytes, layout,
                               gpu_memory_bytes(v["gpu_model"], v["gpu_memory_gb"]),
                               v["mem_fraction_static"])
    for problem in found + ([fit] if fit else []):
        p.error(problem["variable"], problem["value"], problem["problem"] + (
            f" (the toolkit's own check: SGLang decides it only at model load; known model "
            f"{model.name}, matched by sglang_server_model_path)"), problem["fix"])


def _refused_by(v: Validated, dests: tuple[str, ...], owners: dict[str, Setting]
                ) -> tuple[str, Any]:
    """The inventory variable (and its value) behind the first of `dests` the operator set."""
    for dest in dests:
        owner = owners.get(dest)
        if owner is not None:
            if owner.name == "served_model_name" and v["served_model_name"] is None:
                return "model_path", v["model_path"]
            return owner.variable, v[owner.name]
        tokens = _extra_tokens(v, dest)
        if tokens:
            return "extra_args", tokens
    return "extra_args", v["extra_args"]


def _extra_tokens(v: Validated, dest: str) -> list[str]:
    """The extra_args tokens (flag and value) that set SGLang's `dest`."""
    extra = v["extra_args"] or []
    out = []
    for i, token in enumerate(extra):
        option = v.catalogue.by_flag.get(token.partition("=")[0])
        if option is None or option.dest != dest:
            continue
        out.append(token)
        if "=" not in token and option.takes_values and i + 1 < len(extra):
            out.append(extra[i + 1])
    return out


def _refuse_rule(rule: Rule, v: Validated, p: Problems) -> None:
    short = rule.fix_variable.removeprefix(PREFIX)
    note = ""
    if short == "attention_backend" and v["attention_backend"] is None:
        note = " (SGLang's default on this hardware)"
    p.error(rule.fix_variable, v.values.get(short), f"matches known-bad {rule.describe()}{note}",
            f"set {rule.fix_variable}: {rule.fix_value!r}, or deploy anyway with "
            f"sglang_server_allow_rules: [{rule.id}]")


# ---- the secret options' way in ----------------------------------------------------------

CONFIG_FLAG = "--config"


def config_file_options(args: list[Any], config_file: str) -> tuple[list[Any], list[list[str]]]:
    """The server's command line without its secret options, which go to `config_file`
    instead (SGLang's `--config`: a YAML file whose keys are option names, merged before the
    command line), and those options as [option, env file variable] pairs. The command line,
    which every local user reads in /proc/PID/cmdline, then holds only the file's path."""
    kept: list[Any] = []
    options: list[list[str]] = []
    for item in args:
        if isinstance(item, dict):  # a secret reference follows its option
            options.append([kept.pop(), item["env"]])
        else:
            kept.append(item)
    return (kept + [CONFIG_FLAG, config_file] if options else kept), options


# ---- stage 4: paths ----------------------------------------------------------------------

def paths(root: str, deployment: str, manager: str, shm_dir: str) -> dict[str, Any]:
    unit_name = f"sglang-{deployment}.service"
    return {
        "root": root,
        "conf_dir": f"{root}/conf",
        "run_dir": f"{root}/run",
        "log_dir": f"{root}/logs",
        "script": f"{root}/conf/{deployment}.launch.sh",
        "env_file": f"{root}/conf/{deployment}.env",
        # The server's secret options (mode 0600), read by SGLang's `--config`.
        "config_file": f"{root}/conf/{deployment}.config.yaml",
        "pid_file": f"{root}/run/{deployment}.pid",
        # The LaunchSpec last started, copied there by the service at each start (0600).
        "running_spec": f"{root}/run/{deployment}.running-spec.json",
        "log_file": f"{root}/logs/{deployment}.log",
        # One release environment per pinned requirement set (launch/envs.py).
        "envs_dir": f"{root}/envs",
        "baseline_file": f"{root}/run/{deployment}.baseline.json",
        "recover_lock": f"{root}/run/{deployment}.recover.lock",
        "evidence_dir": f"{root}/evidence",
        # Written when GPU memory stays held after a kill; deploys refuse the node until it
        # is cleared (playbooks/recover.yml -e sglang_recover_clear_reboot_mark=true).
        "reboot_mark": f"{root}/NEEDS_REBOOT",
        "shm_dir": shm_dir,
        "unit_file": f"/etc/systemd/system/{unit_name}" if manager == "systemd" else None,
    }


def _deployment_name(v: Validated, served: str | None, p: Problems) -> str | None:
    explicit = v["deployment_name"]
    name = explicit or (f"{served}-{v['port']}" if served and v["port"] else None)
    if name is not None and not _DEPLOYMENT_NAME.match(name):
        if explicit:
            p.error("deployment_name", explicit, "must be 1-63 characters of letters, digits, "
                    "'.', '_', '-'", "rename it")
        else:
            # Name the variable the operator set, not the name derived from it.
            source = "served_model_name" if v["served_model_name"] else "model_path"
            p.error(source, v[source], f"names the deployment {describe_value(name)}, which "
                    "must be 1-63 characters of letters, digits, '.', '_', '-'",
                    "set sglang_server_deployment_name explicitly, or a served model name "
                    "of letters, digits, '.', '_', '-'")
        return None
    return name


def _connect_host(listen: str | None) -> str:
    """The address the node itself reaches the server at."""
    listen = listen or "127.0.0.1"
    return "127.0.0.1" if listen in ("0.0.0.0", "::") else listen


def _service(v: Any, deployment: str) -> dict[str, Any]:
    return {"manager": v["service_manager"], "unit_name": f"sglang-{deployment}.service",
            "stop_timeout": v["stop_timeout"], "user": v["user"] or "root"}


# ---- a deployment's identity alone ----------------------------------------------------------

# The settings that name a deployment and say where its files and processes are: all that a
# stop, or a removal from the routers, needs. build_identity reads (and refuses) nothing else,
# so a broken secret or flag never keeps an operator from stopping a fleet.
def host_name_errors(host: str, p: Problems) -> None:
    """The controller keeps a host's evidence in a folder named after it (evidence/<host>/):
    a name that is not one plain path component would put it outside the store."""
    if host in ("", ".", "..") or "/" in host or "\0" in host:
        p.errors.append(SpecError(
            host, "inventory_hostname", describe_value(host),
            "is not usable as a folder name (it holds '/' or is '.' or '..'), and the "
            "controller keeps the host's evidence in a folder named after it",
            "rename the host in the inventory (e.g. without '/'), and put its address in "
            "ansible_host"))


IDENTITY_SETTINGS = ("model_path", "served_model_name", "deployment_name", "port", "host",
                     "root", "shm_dir", "service_manager", "user", "stop_timeout", "group",
                     "node_rank", "group_nodes")


def build_identity(settings: dict[str, Any], host: str,
                   group_members: list[str] | None = None) -> dict[str, Any]:
    """The deployment's identity from its identity settings (recovery's overrides applied):
    {"ok", "errors", ..., "spec": the LaunchSpec's host, deployment, marker, paths, service,
    group, http and listen address, or None}."""
    p = Problems(host, PREFIX)
    host_name_errors(host, p)
    overrides = settings.get(PREFIX + "overrides")
    given = {**settings, **(overrides if isinstance(overrides, dict) else {})}
    rows = _table().by_name
    v = {name: coerce(rows[name], given.get(PREFIX + name, rows[name].default), p)
         for name in IDENTITY_SETTINGS}
    served = v["served_model_name"] or (
        v["model_path"].rstrip("/").split("/")[-1] if v["model_path"] else None)
    deployment = _deployment_name(v, served, p)
    if p.errors or not deployment:
        return _result(p, None)
    members = list(group_members or [])
    if v["group"] and host in members:
        group_size_errors(v, members, p)
        if p.errors:
            return _result(p, None)
    rank = (v["node_rank"] if v["node_rank"] is not None else
            members.index(host) if v["group"] and host in members else 0)
    return _result(p, {
        "schema": SCHEMA,
        "host": host,
        "deployment": deployment,
        "marker": f"{host}:{deployment}",
        "paths": paths(v["root"], deployment, v["service_manager"], v["shm_dir"]),
        "service": _service(v, deployment),
        "group": {"name": v["group"], "node_rank": rank, "serves_http": rank == 0},
        "http": {"url": f"http://{_connect_host(v['host'])}:{v['port']}", "port": v["port"]},
        "settings": {PREFIX + "host": v["host"]},
    })


# ---- stage 5: the gate -------------------------------------------------------------------

def gate(v: Validated, root: str, deployment: str, connect_host: str, simulated: bool,
         p: Problems) -> dict[str, Any]:
    windows, ceilings = default_windows(v["model_size_b"])
    for short, target in (("gate_stall_windows", windows), ("gate_ceilings", ceilings)):
        for phase, seconds in (v[short] or {}).items():
            if phase not in PHASES[:-1]:
                p.error(short, phase, f"{describe_value(phase)} is not a start-up phase",
                        f"use one of: {', '.join(PHASES[:-1])}")
            elif isinstance(seconds, bool) or not isinstance(seconds, int | float) \
                    or seconds <= 0:
                p.error(short, seconds, f"{phase} must be a positive number of seconds",
                        "e.g. 300")
            else:
                target[phase] = seconds
    poll = v["gate_poll_interval"] or 10
    return {
        **stack_sampling(v, p),
        "stall_windows": windows,
        "ceilings": ceilings,
        "poll_interval": poll,
        # Enough polls to outlast every phase's ceiling back to back.
        "max_polls": int(sum(ceilings.values()) // poll) + 1,
        "health_timeout": v["health_timeout"],
        "kernel_log": f"{root}/sim/kmsg" if simulated else (v["kernel_log"] or "kmsg"),
        "state_file": f"{root}/run/{deployment}.gate.json",
        "host": connect_host,
    }


def stack_sampling(v: Validated, p: Problems) -> dict[str, Any]:
    """The gate's stack sampling (sglang_health's stack_* and py_spy options). A window shorter
    than FROZEN_SAMPLES intervals can end before the ranks have the samples the classifier
    needs to call their stacks frozen: the window would say what the gate cannot do."""
    interval, window = v["stack_interval"], v["stack_window"]
    py_spy = v["py_spy"] or ""
    if py_spy and not py_spy.startswith("/"):
        p.error("py_spy", py_spy, "must be an absolute path of py-spy on the node",
                "e.g. /opt/sglang-fleet/venv/bin/py-spy, or empty to find it beside the "
                "server's Python")
    needed = FROZEN_SAMPLES * interval if interval else None
    if v["stack_sampling"] and needed and window and window < needed:
        p.error("stack_window", window,
                f"is shorter than {FROZEN_SAMPLES} samples of each rank at "
                f"sglang_server_stack_interval {interval:g} s ({needed:g} s): the stacks "
                f"cannot be judged frozen within it",
                f"set sglang_server_stack_window to {needed:g} or more, or "
                f"sglang_server_stack_interval to {int(window * 10 / FROZEN_SAMPLES) / 10:g} "
                f"or less")
    return {"stack_sampling": v["stack_sampling"], "py_spy": py_spy,
            "stack_interval": interval, "stack_window": window}


# ---- assembly ----------------------------------------------------------------------------

def secret_fingerprint(secret: str) -> str:
    """A secret's fingerprint: enough to tell two keys apart, never the key (the one the runner's
    artifacts are scrubbed by, module_utils/common/secrets.fingerprint)."""
    return fingerprint(secret)


def config_hash(spec_core: dict[str, Any]) -> str:
    """A stable name for a configuration: same inputs, same hash, secrets excluded."""
    blob = json.dumps(spec_core, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def build_launch_spec(
    settings: dict[str, Any],
    host: str,
    group_members: list[str] | None = None,
    dist_init_host: str | None = None,
    seed_of: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build and validate one host's LaunchSpec.

    Returns {"ok": bool, "errors": [str], "error_details": [...], "warnings": [str],
    "spec": dict or None}. group_members is the sorted membership of the host's
    `sglang_server_group` (None for a single-node server); dist_init_host is the address of
    the group's rank 0; seed_of is what the inventory says of the host that
    sglang_server_weights_from_instance names (seed.SeedHost's fields).
    """
    p = Problems(host, PREFIX)
    host_name_errors(host, p)
    v = validate(settings, p)
    if v is None:
        return _result(p, None)
    topo = topology(v, host, group_members, dist_init_host, p)
    served = v["served_model_name"] or (
        v["model_path"].rstrip("/").split("/")[-1] if v["model_path"] else None)
    seed_host = seed.SeedHost.from_mapping(seed_of)
    from_seed = seed.seed_args(v.values, host, seed_host, _seed_server(v, host, seed_host, p),
                               v.release.version, v.catalogue, p)
    cmd = server_command(v, topo, host, served or "", p, from_seed)
    pd.side_checks(v.values, p)
    deployment = _deployment_name(v, served, p)
    root = v["root"]
    simulated = v["install_mode"] == "simulator"
    connect_host = _connect_host(v["host"])
    gate_spec = gate(v, root or "", deployment or "", connect_host, simulated, p)
    unit_problem = unit_path_problem(root) if root and v["service_manager"] == "systemd" \
        else None
    if unit_problem:
        p.error("root", root, unit_problem, "choose a root without quotes or backslashes "
                "(spaces, '$', ';' and '%' are fine: the unit escapes them), or set "
                "sglang_server_service_manager: supervisor")
    kcache = _kernel_cache(v, root, cmd.env, p) if root else None
    if p.errors:
        return _result(p, None)
    assert root and deployment and served  # narrowed by the checks above

    layout = paths(root, deployment, v["service_manager"], v["shm_dir"])
    mode = v["install_mode"]
    requirements = envs.pip_requirements(v["pip_package"], v.release.version,
                                         v["pip_extra_packages"])
    release_env = envs.environment(mode, bool(v["sim_pip"]), root, requirements, v["python"])
    server_python = release_env["python"]
    if mode in ("pip", "existing"):
        launch = [server_python, "-m", v.release.launch_module]
        args_parser = v.release.args_parser
    else:
        launch = [server_python, "-m", "sglang_fleet.sim.launch_server"]
        args_parser = "sglang_fleet.sim.args.server_args:prepare_server_args"

    marker = f"{host}:{deployment}"
    env = dict(cmd.env)
    env[MARKER_VAR] = marker
    # SGLang renames its workers with setproctitle, which by default reuses the environ area
    # and so erases the marker from /proc/PID/environ; SPT_NOENV keeps the environment intact.
    env["SPT_NOENV"] = "1"
    if kcache:
        env.update(kcache.pop("env"))
    if simulated:
        env.update({
            "SGLANG_SIM_GPU_DIR": f"{root}/sim/gpus",
            "SGLANG_SIM_SHM_DIR": layout["shm_dir"],
            "SGLANG_SIM_PROFILE": str(v["sim_profile"]),
            "SGLANG_SIM_TIME_FACTOR": _env_value(v["sim_time_factor"]),
            "SGLANG_SIM_FAULT": str(v["sim_fault"] or ""),
            # The simulator parses with the pinned release's catalogue, as that release would.
            "SGLANG_SIM_VERSION": v.release.version,
            **_sim_catalogue(v.release.version),
        })
        if v["sim_regress"]:  # only when asked, so no other server's configuration changes
            env["SGLANG_SIM_REGRESS"] = str(v["sim_regress"])
    service = _service(v, deployment)
    server_argv, config_options = config_file_options(cmd.args, layout["config_file"])
    core = {"argv": launch + server_argv, "env": env, "secret_env_names": cmd.secret_env_names,
            "service": service}
    chash = config_hash(core)
    env[CONFIG_VAR] = chash
    spec = {
        "schema": SCHEMA,
        "host": host,
        "deployment": deployment,
        "marker": marker,
        "config_hash": chash,
        "sglang_version": v.release.version,
        "argv": launch + server_argv,
        # The secret options the config file holds: [option, env file variable].
        "config_options": config_options,
        # The server's own arguments as SGLang reads them once the config file is merged,
        # secrets masked: for parsing checks and display.
        "server_args": [a if isinstance(a, str) else "********" for a in cmd.args],
        "env": env,
        "secret_env_names": cmd.secret_env_names,
        # Every secret setting and its env file variable: the files step reads their values.
        "secret_variables": [[env, variable] for variable, env in
                             _table().secret_env.items()],
        # Which secrets were given, as fingerprints only: the node check refuses a start that
        # would drop one the deployment ran with (a key that resolved to nothing).
        "secret_fingerprints": {s.env: secret_fingerprint(v[s.name]) for s in _table()
                                if s.secret and s.env and v[s.name]},
        "secret_drops": [_table().secret_env[name] for name in v["drop_secrets"] or []],
        "service": service,
        "paths": layout,
        "install": {
            "mode": mode,
            "python": v["python"],
            "server_python": server_python,
            "pip_requirements": requirements,
            "pip_extra_args": v["pip_extra_args"],
            # The release environment it runs on; pruning keeps sglang_server_env_keep.
            "env": release_env,
            "env_keep": v["env_keep"],
            "args_parser": args_parser,
        },
        "gpu": {"backend": "simulated" if simulated else "nvml",
                "count": v["gpu_count"], "compute_capability": cmd.facts["compute_capability"],
                "model": v["gpu_model"], "used_per_node": topo.gpus_per_node,
                "sim_dir": f"{root}/sim/gpus" if simulated else None},
        "model": {"path": v["model_path"], "served_name": served, "family": v["model_family"],
                  "size_b": v["model_size_b"],
                  # What the node check holds the node's own config.json and GPUs to.
                  "check": {"layout": cmd.layout,
                            "mem_fraction_static": v["mem_fraction_static"]}},
        "group": {"name": topo.group, "nnodes": topo.nnodes, "node_rank": topo.node_rank,
                  "dist_init_addr": topo.dist_init_addr, "serves_http": topo.serves_http},
        "http": {"url": f"http://{connect_host}:{v['port']}", "port": v["port"]},
        # What it takes on its machine: the fleet-wide check refuses two servers of one
        # machine whose ports or GPUs overlap.
        "binds": _binds(v, cmd, topo, f"{root}/sim/gpus" if simulated else None),
        # The server's side of its PD deployment and what the deployment must agree on.
        "pd": pd.pd_view(v.values, cmd.parsed, cmd.env, served),
        # The running server this one loads its weights from (the node checks that it serves
        # before this one starts), or None.
        "weights_from_instance": _seed_view(v, from_seed),
        "facts": cmd.facts,
        # The kernel caches' folders on the node and their key (sglang_server_kernel_cache),
        # or None: staging fills the live folder before the start and harvests it after.
        "kernel_cache": kcache,
        # The inputs with the overrides applied, secrets left out: what recovery compares with
        # the last known good.
        "settings": public_settings(v.effective),
        "gate": gate_spec,
        "allowed_rules": cmd.allowed_rules,
        # The simulated node's own hardware, independent of what the inventory claims, so
        # that preflight's comparison means the same on a simulated node as on a real one.
        "sim": _simulated_node(v, cmd, layout, topo) if simulated else None,
    }
    spec["group"]["fingerprint"] = config_hash(_group_view(spec))
    case = cmd.release_case
    if case and simulated:  # where the simulated server finds its verdict (release_check)
        case = {**case, "sim_config": chash}
    return {**_result(p, spec), "release_case": case}


def _seed_server(v: Validated, host: str, seed_host: seed.SeedHost | None, p: Problems
                 ) -> seed.SeedServer | None:
    """The seed's server as its own variables build it (over the role's defaults), or None
    when there is none to build or they do not build (said on this host)."""
    if not v["weights_from_instance"] or seed_host is None or not seed_host.in_inventory \
            or seed_host.name == host:
        return None
    sp = Problems(seed_host.name, PREFIX)
    sv = validate({**_table().defaults(), **seed_host.settings}, sp)
    if sv is None or sp.errors:
        first = str(sp.errors[0]) if sp.errors else "its release does not build"
        p.error("weights_from_instance", seed_host.name, f"the seed's own variables do not "
                f"build a server ({first})", "correct the seed's inventory first")
        return None
    served = sv["served_model_name"] or str(sv["model_path"] or "").rstrip("/").rsplit("/", 1)[-1]
    return seed.SeedServer(sv.release.version, served, sv["tp"], sv["pp"], sv["ep"], sv["host"],
                           sv["port"], tuple(sv["extra_args"] or ()), sv["group"],
                           bool(sv["api_key"] or sv["admin_api_key"]))


def _seed_view(v: Validated, from_seed: list[str]) -> dict[str, Any] | None:
    if not from_seed:
        return None
    flags = dict(zip(from_seed[::2], from_seed[1::2], strict=True))
    return {"seed": v["weights_from_instance"],
            "url": f"http://{flags[seed.IP_FLAG]}:{flags[seed.PORT_FLAG]}",
            "ports": list(v["weights_from_instance_ports"] or []),
            "backend": v["weights_from_instance_backend"]}


def _kernel_cache(v: Validated, root: str, env: dict[str, str], p: Problems
                  ) -> dict[str, Any] | None:
    """The kernel caches' view when sglang_server_kernel_cache is on; an extra_env variable
    that would point a cache elsewhere is refused (the staged folder would go unread)."""
    if not v["kernel_cache"]:
        return None
    view = kernel_cache_view(root, v.release.version,
                             compute_capability(v["gpu_compute_capability"]) or "", v["tp"])
    for name in sorted(set(env) & set(view["env"])):
        p.error("extra_env", name, f"{name} would move a kernel cache out of the folder "
                "sglang_server_kernel_cache stages", "remove it from sglang_server_extra_env, "
                "or set sglang_server_kernel_cache: false")
    return view


def _sim_catalogue(version: str) -> dict[str, str]:
    """Where the simulator reads a release's catalogue that only the controller's cache holds
    (one the package does not carry): the simulated node is this machine."""
    source = catalogue_source(version)
    if source is None or source == catalogue_path(version):
        return {}
    return {"SGLANG_SIM_CATALOGUE": str(source)}


def _binds(v: Validated, cmd: ServerCommand, topo: Topology, sim_gpus: str | None
           ) -> dict[str, Any]:
    """The ports the server listens on, each by the variable that sets it, and its GPUs."""
    parsed = cmd.parsed
    ports: dict[str, int | None] = {PREFIX + "port": v["port"]}
    if v["disaggregation_mode"] == "prefill":
        ports[PREFIX + "disaggregation_bootstrap_port"] = parsed.get(
            "disaggregation_bootstrap_port")
    if topo.group and topo.node_rank == 0:
        ports[PREFIX + "dist_init_port"] = v["dist_init_port"]  # rank 0 hosts the store
    if parsed.get("nccl_port"):
        ports["--nccl-port in " + PREFIX + "extra_args"] = parsed["nccl_port"]
    gpus = clashes.gpu_ids(int(parsed.get("base_gpu_id") or 0),
                           int(parsed.get("gpu_id_step") or 1), topo.gpus_per_node,
                           cmd.env.get("CUDA_VISIBLE_DEVICES"))
    return clashes.server_binds(v["host"], ports, gpus, sim_gpus)


def _simulated_node(v: Validated, cmd: ServerCommand, layout: dict[str, Any],
                    topo: Topology) -> dict[str, Any]:
    """What the simulated node is made of, independent of what the inventory claims (so that
    the node check's comparison means the same on a simulated node as on a real one): its
    GPUs, and the stand-in of the model its path names (the shape and size of a model the
    toolkit knows). The node check writes it; the GPU layer's simulated backend reads it."""
    profile = sim_profile(str(v["sim_profile"]))
    known = known_model(v["model_path"])
    return {"gpu_count": v["sim_gpu_count"],
            "compute_capability": compute_capability(v["sim_compute_capability"]),
            "profile": str(v["sim_profile"]),
            "gpu_model": v["gpu_model"],
            "gpu_memory_gb": profile["gpu_memory_total_gb"],
            "interconnect": cmd.facts["interconnect"],
            "model_type": profile["model_type"],
            "weight_shards": profile["weight_shards"],
            "model_config": known.config_json() if known else {},
            "checkpoint_bytes": known.checkpoint_bytes if known else None,
            # The simulated node's folder: the stand-in model must lie inside it (a group's
            # nodes share the folder that holds their roots).
            "root": layout["root"].rsplit("/", 1)[0] if topo.group else layout["root"]}


def _group_view(spec: dict[str, Any]) -> dict[str, Any]:
    """What every node of a multi-node server must agree on: argv without what is each
    node's own, its rank and its listen address (a non-zero rank binds its dummy health
    server there)."""
    argv = list(spec["argv"])
    for own in ("--node-rank", "--host"):
        if own in argv:
            i = argv.index(own)
            del argv[i:i + 2]
    return {"argv": argv[1:], "version": spec["sglang_version"],
            # The simulator's SGLANG_SIM_* name each node's own simulated hardware.
            "env": {k: v for k, v in spec["env"].items() if k.startswith(("NCCL_", "SGLANG_"))
                    and not k.startswith("SGLANG_SIM_") and k not in (MARKER_VAR, CONFIG_VAR)}}


def group_consistency_errors(specs: dict[str, dict[str, Any]]) -> list[str]:
    """Errors when the nodes of one multi-node server disagree (ranks, address, arguments)."""
    errors: list[str] = []
    by_group: dict[str, list[dict[str, Any]]] = {}
    for spec in specs.values():
        if spec and spec["group"]["name"]:
            by_group.setdefault(spec["group"]["name"], []).append(spec)
    unbuilt = sorted(host for host, spec in specs.items() if not spec)
    if by_group and unbuilt:
        errors.append(f"hosts {', '.join(unbuilt)} have no LaunchSpec yet, so the nodes of "
                      f"{', '.join(sorted(by_group))} cannot be compared. Fix: run with the "
                      f"linear strategy (the default): the check needs every host's "
                      f"LaunchSpec of the batch built first")
    for name, members in sorted(by_group.items()):
        ranks: dict[int, str] = {}
        for spec in members:
            rank = spec["group"]["node_rank"]
            if rank in ranks:
                errors.append(f"group {name}: hosts {ranks[rank]} and {spec['host']} both have "
                              f"node rank {rank}. Fix: unset sglang_server_node_rank to derive "
                              f"ranks from group order, or give each node a unique rank")
            ranks[rank] = spec["host"]
        addrs = {s["group"]["dist_init_addr"] for s in members}
        if len(addrs) > 1:
            errors.append(f"group {name}: members disagree on the dist-init address "
                          f"{sorted(addrs)}. Fix: set sglang_server_dist_init_host once, in "
                          f"group_vars/{name}")
        prints = {s["group"]["fingerprint"] for s in members}
        if len(prints) > 1:
            seen = ", ".join(f"{s['host']}={s['group']['fingerprint']}" for s in members)
            errors.append(f"group {name}: members render different server arguments "
                          f"({seen}). "
                          f"Fix: set the sglang_server_* variables in group_vars/{name}, not "
                          f"per host")
    return errors


def inventory_binds(settings: dict[str, Any], host: str,
                    group_members: list[str] | None = None,
                    seed_of: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """What a server takes on its machine (the LaunchSpec's `binds`), built from its
    inventory variables over the settings' defaults, for a server outside the run (--limit,
    a later batch) whose LaunchSpec the run does not build; None when it does not build."""
    built = build_launch_spec({**_table().defaults(), **settings}, host, group_members,
                              seed_of=seed_of)
    return built["spec"]["binds"] if built["ok"] else None


def launch_refusals(launch: dict[str, Any], launches: dict[str, Any],
                    specs: dict[str, Any]) -> list[str]:
    """What refuses one host's LaunchSpec (`launch`: its build's ok, errors, warnings): its own
    errors, else the disagreements of its multi-node group. `launches` and `specs` map each
    host of the group in the batch to its build's verdict and its LaunchSpec (None when not
    built yet); members refused on their own are left out, since they say why themselves."""
    if not launch.get("ok"):
        return list(launch.get("errors") or [])
    built = {host: spec for host, spec in specs.items()
             if (launches.get(host) or {}).get("ok", True)}
    return group_consistency_errors(built) if built else []


def _result(p: Problems, spec: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "ok": not p.errors,
        "errors": [str(e) for e in p.errors],
        "error_details": [asdict(e) for e in p.errors],
        "warnings": p.warnings,
        "spec": spec,
    }


def warm_caches() -> None:
    """Build the LaunchSpec of the settings' defaults once, and read every simulator profile.
    A process that forks workers (ansible-playbook, per task and host) then hands each of
    them the parsed catalogue and parser, the rules and the release table, instead of every
    worker building them again for its host."""
    from sglang_fleet.known.reviewed import shipped_sim_profiles, sim_profile

    build_launch_spec(_table().defaults(), "localhost")
    for name in shipped_sim_profiles():
        sim_profile(name)
