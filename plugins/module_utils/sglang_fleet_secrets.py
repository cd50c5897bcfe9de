# -*- coding: utf-8 -*-
# Secret values in structured records (LaunchSpecs, settings, ledger entries, runner events):
# found by the name they are stored under, at any depth of nesting, and masked before the
# record is written anywhere but the node's env file. Shared by the node (evidence) and the
# controller (runner artifacts, ledger), so both mask the same names the same way.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

MASK = "********"

# The toolkit's own secret settings and the environment variables they become.
SECRET_NAMES = frozenset((
    "sglang_server_api_key", "sglang_server_hf_token", "api_key", "admin_api_key", "hf_token",
    "SGLANG_FLEET_API_KEY", "HF_TOKEN",
))
# Names that look like secrets but hold none: the LaunchSpec's list of secret variable names.
NOT_SECRET = frozenset(("secret_env_names",))
_SECRET_WORDS = frozenset(("token", "secret", "password", "passwd", "credential",
                           "credentials", "cookie", "apikey"))
_SECRET_SUFFIXES = ("api_key", "private_key", "access_key", "secret_key")


def is_secret_name(name):
    """True for a key whose value is a secret: the toolkit's own names, and names made of
    words such as token, secret or password (`hf_token`, `MY_SERVICE_TOKEN`, `db_password`),
    but not `tokenizer_path`."""
    if not isinstance(name, str) or name in NOT_SECRET:
        return False
    if name in SECRET_NAMES:
        return True
    lower = name.lower()
    words = set(re.split(r"[^a-z0-9]+", lower))
    return bool(words & _SECRET_WORDS) or lower.endswith(_SECRET_SUFFIXES)


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
