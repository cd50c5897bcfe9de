# -*- coding: utf-8 -*-
# Secret values in structured records (LaunchSpecs, settings, ledger entries, runner events):
# found by the name they are stored under, at any depth of nesting, and masked before the
# record is written anywhere but the node's env file. Shared by the node (evidence) and the
# controller (runner artifacts, ledger), so both mask the same names the same way.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import re

MASK = "********"

# ---- generated from the settings tables: python -m sglang_fleet.settings --write ----
# The toolkit's secret settings (server and router), their short names, the env file variables
# they are stored under, and the command-line options whose values are secrets.
SECRET_NAMES = frozenset((
    "HF_TOKEN", "SGLANG_FLEET_ADMIN_API_KEY", "SGLANG_FLEET_API_KEY",
    "SGLANG_FLEET_SSL_KEYFILE_PASSWORD", "SGLANG_FLEET_WATERMARK_CONFIG",
    "SGLANG_ROUTER_API_KEY", "admin_api_key", "api_key", "control_plane_api_keys", "hf_token",
    "sglang_router_api_key", "sglang_router_control_plane_api_keys",
    "sglang_server_admin_api_key", "sglang_server_api_key", "sglang_server_hf_token",
    "sglang_server_ssl_keyfile_password", "sglang_server_watermark_config",
    "ssl_keyfile_password", "watermark_config",
))
SECRET_FLAGS = (
    "--admin-api-key", "--api-key", "--control-plane-api-keys", "--ssl-keyfile-password",
    "--watermark-config",
)
SECRET_PREFIXES = (
    "SGLANG_ROUTER_CONTROL_PLANE_KEY_",
)
# ---- end of the generated part ----
# Names that look like secrets but hold none: the LaunchSpec's list of secret variable names.
NOT_SECRET = frozenset(("secret_env_names", "secret_variables", "secret_fingerprints",
                        "secret_drops"))
# SGLang's own environment variables whose names the words below would call secret, but which
# the release declares not secret (`secret=` of each variable in its sglang/srt/environ.py; a
# graph key is a CUDA-graph shape). tests/reference/test_secret_names.py checks this list
# against the release's declarations, both ways.
SGLANG_NOT_SECRET = frozenset(("SGLANG_LOG_DECODE_GRAPH_KEY",))
# Words that make a name secret wherever they stand in it (`db_password`, `MY_PASSPHRASE`,
# `SGL_BEARER`), words that do only as its last word (`hf_token`, `MY_SERVICE_TOKEN`, `GITHUB_AUTH`:
# not `SGLANG_INIT_NEW_TOKEN_RATIO` or `auth_level`), and a last word ending in `key`/`keys`
# (`api_key`, `RKEY`, `ADMIN_KEY`, `private_key`, `control_plane_api_keys`).
_SECRET_WORDS = frozenset(("secret", "password", "passwd", "passphrase", "credential",
                           "credentials", "apikey", "bearer"))
_SECRET_LAST_WORDS = frozenset(("token", "auth", "authorization", "cookie"))
_COUNTED = frozenset(("per", "first", "next", "last"))


def is_secret_name(name):
    """The one rule for a name (a record's key, an environment variable, a setting) whose value
    is a secret: the toolkit's own names, names with a word such as secret, password,
    passphrase or bearer, and names whose last word is token, auth or cookie, or ends in key
    (`RKEY`, `admin_key`); not `tokenizer_path`, `max_tokens`, `SGLANG_INIT_NEW_TOKEN_RATIO`
    or SGLang's own variables that it declares not secret. Case does not matter."""
    if not isinstance(name, str) or name in NOT_SECRET or name in SGLANG_NOT_SECRET:
        return False
    if name in SECRET_NAMES or name.startswith(SECRET_PREFIXES):
        return True
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    if not words:
        return False
    if words[-1] == "token" and len(words) > 1 and words[-2] in _COUNTED:
        return bool(set(words) & _SECRET_WORDS)  # `per_token`, `time_to_first_token`: a count
    return bool(set(words) & _SECRET_WORDS) or words[-1] in _SECRET_LAST_WORDS or \
        words[-1].endswith(("key", "keys"))


def fingerprint(secret):
    """A secret's fingerprint: enough to tell two values apart (and to recognise a value as one
    the run used as a secret), never the value."""
    return "sha256:" + hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()[:12]


def mask_argv(args):
    """A command line with the value of every secret option masked (`--api-key X` and
    `--api-key=X`)."""
    out, hide_next = [], False
    for arg in args:
        flag, eq, _ = arg.partition("=")
        if hide_next:
            out.append(MASK)
        elif eq and flag in SECRET_FLAGS:
            arg = flag + "=" + MASK
            out.append(arg)
        else:
            out.append(arg)
        hide_next = not hide_next and arg in SECRET_FLAGS
    return out


def mask_secrets(value):
    """A copy of `value` with every secret-named entry's value masked, at any depth. Empty
    values stay empty (an empty secret is worth seeing); the structure is kept."""
    if isinstance(value, dict):
        return dict((k, _masked(v) if is_secret_name(k) else mask_secrets(v))
                    for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [mask_secrets(v) for v in value]
    return value


def _masked(value):
    if value is None or value == "" or value == {} or value == []:
        return value
    return MASK


def secret_paths(value, path=""):
    """Where secret-named entries with a value sit in `value`: ['a.b.api_key', ...]."""
    found = []
    if isinstance(value, dict):
        for k, v in value.items():
            here = "%s.%s" % (path, k) if path else str(k)
            if is_secret_name(k) and _masked(v) == MASK:
                found.append(here)
            else:
                found.extend(secret_paths(v, here))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found.extend(secret_paths(v, "%s[%d]" % (path, i)))
    return found


# ---- a secret a deployment started with, and that resolves to nothing now ----

def _variable_of(env, variables):
    """The inventory variable behind an env file variable: `variables` pairs each env file
    variable, or a family of them (`NAME_*`, one per item of a list setting), with its
    variable."""
    for name, variable in variables:
        if env == name or (name.endswith("*") and env.startswith(name[:-1])):
            return variable
    return env


def vanished_secret(secrets, before, drop_setting, what="this deployment", whom="the server"):
    """The refusal of a secret setting that `what` last started with (`before`: the record of
    that start, with its secret_env_names, secret_fingerprints and config_hash) and that now
    resolves to nothing (an unset environment variable, a vault not opened), unless dropped on
    purpose (`drop_setting` names the setting that does): starting without it would serve
    openly. None when nothing vanished. `secrets`: this start's env file variables (names),
    their inventory variables (variables) and those it may leave out (drops). One check for
    the servers and the router."""
    variables = secrets.get("variables") or []
    kept = set(_variable_of(env, variables)
               for env in list(secrets.get("names") or []) + list(secrets.get("drops") or []))
    fingerprints = before.get("secret_fingerprints") or {}
    for env in sorted(before.get("secret_env_names") or []):
        variable = _variable_of(env, variables)
        if variable in kept:
            continue
        return (
            "%s resolves to nothing, but %s last started with it (config %s, %s): a secret "
            "that vanished (an environment variable not set on the controller, a vault not "
            "opened) would restart %s without it. Fix: make %s resolve again where the "
            "inventory reads it (the controller's environment, ansible-vault), or leave it out "
            "on purpose with %s: [%s]"
            % (variable, what, before.get("config_hash", "?"),
               fingerprints.get(env, "fingerprint unrecorded"), whom, variable, drop_setting,
               variable))
    return None
