"""The simulator's remote-instance handshake against SGLang 0.5.23's own source: the request
bodies the new server posts, the fields the seed requires, the texts both sides log, and the
flags the toolkit renders (read from the installed release, not copied)."""

from __future__ import annotations

import ast
import inspect
import re

import pytest

from sglang_fleet.known import refenv
from sglang_fleet.launch import seed
from sglang_fleet.sim.frontend import weight_export
from sglang_fleet.sim.srt.model_loader import remote_instance

VERSION = "0.5.23"


@pytest.fixture(scope="module")
def env():
    return refenv.ensure(VERSION, quiet=True)


def _source(env, file: str) -> str:
    return (env.sglang_dir / "sglang" / file).read_text()


def _json_keys(function: ast.FunctionDef) -> list[set[str]]:
    """The keys of each `json={...}` a function posts."""
    return [{k.value for k in kw.value.keys}
            for call in ast.walk(function) if isinstance(call, ast.Call)
            for kw in call.keywords if kw.arg == "json" and isinstance(kw.value, ast.Dict)]


def _functions(text: str) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef)}


def _strings(module) -> list[str]:
    """Every string constant of a module, adjacent literals joined as Python joins them."""
    return [n.value for n in ast.walk(ast.parse(inspect.getsource(module)))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_the_loader_posts_the_releases_bodies(env):
    real = _functions(_source(env, "srt/model_loader/remote_instance_weight_loader_utils.py"))
    ours = _functions(inspect.getsource(remote_instance))
    for name in ("trigger_init_weights_send_group_for_remote_instance_request",
                 "trigger_transferring_weights_request"):
        assert _json_keys(ours[name]) == _json_keys(real[name]), name


def test_the_seed_requires_the_fields_the_release_requires(env):
    tree = ast.parse(_source(env, "srt/managers/io_struct.py"))
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for path, cls in ((weight_export.INIT_PATH, "InitWeightsSendGroupForRemoteInstanceReqInput"),
                      (weight_export.SEND_PATH, "SendWeightsToRemoteInstanceReqInput")):
        required = {s.target.id for s in classes[cls].body
                    if isinstance(s, ast.AnnAssign) and s.value is None}
        assert set(weight_export._REQUIRED[path]) == required, cls


def test_the_log_and_answer_texts_are_the_releases(env):
    texts = (_source(env, "srt/model_loader/loader.py")
             + _source(env, "srt/connector/remote_instance.py")
             + _source(env, "srt/model_executor/model_runner_components/weight_exporter.py")
             + _source(env, "srt/arg_groups/model_path_hook.py")
             + _source(env, "srt/entrypoints/http_server.py"))
    ours = "\n".join(_strings(remote_instance) + _strings(weight_export))
    for text in ("Loading weights from remote instance ...", "init custom process group: ",
                 "rank_offset=", "Failed to initialize custom process group: ",
                 "Succeeded to init group through ", "Succeeded to send weights through ",
                 "not in _weights_send_group list. Please call",
                 "Fallback load_format to 'auto' due to incomplete remote instance weight loader",
                 "Missing or invalid rank parameter", "Failed to get transfer engine info for rank",
                 weight_export.INIT_PATH, weight_export.SEND_PATH,
                 *weight_export.TE_INFO_PATHS):
        assert text in texts, text
        assert text in ours, text


def test_the_rendered_flags_are_the_releases(env):
    fields = _source(env, "srt/arg_groups/fields/model.py")
    for flag in (seed.IP_FLAG, seed.PORT_FLAG, seed.PORTS_FLAG, seed.BACKEND_FLAG,
                 seed.SEED_TRANSFER_ENGINE_FLAG):
        assert re.search(rf"^\s+{flag[2:].replace('-', '_')}: A\[", fields, re.M), flag
    assert f'"{seed.LOAD_FORMAT}"' in _source(env, "srt/arg_groups/choices.py")
    timeout = _source(env, "srt/utils/common.py")
    assert "default_pg_timeout" in timeout  # init_custom_process_group's default, 30 minutes
    assert remote_instance.DEFAULT_PG_TIMEOUT_S == 1800
