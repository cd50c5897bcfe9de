"""The one secret-name rule against SGLang's own environment variables: every variable the
release declares (sglang/srt/environ.py) is a secret to the rule exactly when the release
declares it one (its `secret=` argument), so `sglang_server_extra_env` takes SGLang's own
switches and refuses its credentials, and the node masks the same names."""

from __future__ import annotations

import ast

from sglang_fleet.known import refenv
from sglang_fleet.node.common import secrets as registry

VERSION = "0.5.23"


def declared_variables(source: str) -> dict[str, bool]:
    """Each environment variable the release's environ.py declares (`NAME = EnvBool(...)`
    in its classes), and whether it declares it secret."""
    declared = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and node.value.func.id.startswith("Env")):
            continue
        secret = any(k.arg == "secret" and isinstance(k.value, ast.Constant) and k.value.value
                     for k in node.value.keywords)
        for target in node.targets:
            if isinstance(target, ast.Name) and target.id.isupper():
                declared[target.id] = secret
    return declared


def test_sglangs_own_variables_are_secret_exactly_when_it_declares_them_so():
    env = refenv.ensure(VERSION, quiet=True)
    declared = declared_variables((env.sglang_dir / "sglang/srt/environ.py").read_text())
    assert len(declared) > 500 and declared["EXA_API_KEY"], "environ.py's shape changed"
    disagree = {name: secret for name, secret in declared.items()
                if registry.is_secret_name(name) != secret}
    assert disagree == {}, "SGLang's declaration (True: secret) against the rule"
    # The rule's exceptions are SGLang's declared non-secrets, none left over.
    assert {name for name in registry.SGLANG_NOT_SECRET if declared.get(name) is not False} \
        == set()
