"""Runs INSIDE a reference environment that has a real SGLang release installed (no GPU needed),
never in sglang-fleet's own environment: standard library plus SGLang only.

    <ref python> catalogue_probe.py dump            -> the release's options as JSON
    <ref python> catalogue_probe.py parse  < argvs  -> SGLang's argparse verdict per command line
    <ref python> catalogue_probe.py prepare < argvs -> prepare_server_args() verdict per line
    <ref python> catalogue_probe.py check < cases  -> the whole resolution's verdict per case
    <ref python> catalogue_probe.py serve NAME IDLE -> answers `check` on a socket (below)

`parse` and `prepare` read a JSON list of argument lists on stdin and print a JSON list of
{"ok", "error", "values"}: "values" holds every parsed destination (JSON-safe) when ok.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from typing import Any

# argparse Action classes SGLang uses, by the kind the catalogue records.
_KINDS = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_StoreConstAction": "store_const",
    "_AppendAction": "append",
    "_CountAction": "count",
    "BooleanOptionalAction": "boolean_optional",
    "DeprecatedStoreTrueAction": "deprecated_store_true",
    "DeprecatedStoreConstAction": "deprecated_store_const",
    "DeprecatedAliasStoreAction": "deprecated_alias",
    "DeprecatedAction": "deprecated",
    "LoRAPathAction": "lora_paths",
}


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_json_safe(v) for v in value), key=repr)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    return {"repr": repr(value)}


def _parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


def dump() -> dict[str, Any]:
    import sglang

    parser = _parser()
    options = []
    for action in parser._actions:
        kind_name = type(action).__name__
        if kind_name == "_HelpAction":
            continue
        if kind_name not in _KINDS:
            raise SystemExit(f"catalogue_probe: unknown argparse action {kind_name} for "
                             f"{action.option_strings}: teach "
                             "sglang_fleet.known.catalogue about it")
        converter = action.type
        entry = {
            "flags": list(action.option_strings),
            "dest": action.dest,
            "kind": _KINDS[kind_name],
            "type": None if converter is None else getattr(converter, "__name__", repr(converter)),
            "nargs": action.nargs,
            "choices": None if action.choices is None else _json_safe(action.choices),
            "default": _json_safe(action.default),
            "required": bool(action.required),
        }
        if action.const is not None:
            entry["const"] = _json_safe(action.const)
        for extra in ("new_flag", "const_value", "error_message"):
            if getattr(action, extra, None) is not None:
                entry[extra] = _json_safe(getattr(action, extra))
        options.append(entry)
    return {
        "sglang_version": sglang.__version__,
        "prog": parser.prog,
        "allow_abbrev": parser.allow_abbrev,
        "options": options,
        "environment": _environment(),
    }


def _environment() -> list[dict[str, Any]]:
    """The environment variables the release declares it reads (sglang/srt/environ.py's
    Envs), with their kind and, where one was renamed, the old name it still takes."""
    try:
        from sglang.srt.environ import EnvField, Envs
    except ImportError:  # a release without the declared table
        return []
    out = []
    for name, field in vars(Envs).items():
        if isinstance(field, EnvField):
            entry = {"name": name, "kind": type(field).__name__}
            old = getattr(field, "deprecated_name", None) or getattr(field, "_deprecated_name",
                                                                      None)
            if isinstance(old, str):
                entry["deprecated_name"] = old
            out.append(entry)
    return sorted(out, key=lambda e: e["name"])


def _verdicts(argvs: list[list[str]], run) -> list[dict[str, Any]]:
    out = []
    for argv in argvs:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                values = run(argv)
            out.append({"ok": True, "error": None, "values": _json_safe(values)})
        except SystemExit:
            out.append({"ok": False, "error": err.getvalue().strip().splitlines()[-1:],
                        "values": None})
        except Exception as exc:  # noqa: BLE001 - any refusal counts, named by its type
            final = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            out.append({"ok": False, "error": [final], "values": None,
                        "raised_at": _raised_at(exc)})
    return out


def _raised_at(exc: BaseException) -> dict[str, Any] | None:
    """Where inside SGLang the refusal was raised: its file (from the package root), line and
    statement, as a traceback shows them."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/sglang/" in f.filename]
    if not frames:
        return None
    last = frames[-1]
    return {"file": "sglang/" + last.filename.rsplit("/sglang/", 1)[1], "line": last.lineno,
            "function": last.name, "code": (last.line or "").strip(),
            "statement": _statement(last.filename, last.lineno)}


def _statement(filename: str, line: int) -> str:
    """The whole statement that raised (a raise or assert spans lines), with the condition of
    the `if` that guards a raise: what they read names the arguments refused."""
    import linecache

    first = linecache.getline(filename, line)
    indent = len(first) - len(first.lstrip())
    start = line
    if first.lstrip().startswith("raise"):
        for number in range(line - 1, max(line - 12, 0), -1):
            source = linecache.getline(filename, number)
            if source.strip() and len(source) - len(source.lstrip()) < indent:
                if source.lstrip().startswith(("if ", "elif ")):
                    start = number
                break
    text, depth = [], 0
    for number in range(start, line + 20):
        source = linecache.getline(filename, number)
        if not source:
            break
        text.append(source.strip())
        depth += source.count("(") + source.count("[") - source.count(")") - source.count("]")
        if number >= line and depth <= 0:
            break
    return " ".join(text)


def parse(argvs: list[list[str]]) -> list[dict[str, Any]]:
    parser = _parser()
    return _verdicts(argvs, lambda argv: vars(parser.parse_args(argv)))


def prepare(argvs: list[list[str]]) -> list[dict[str, Any]]:
    from sglang.srt.server_args import prepare_server_args

    def run(argv: list[str]) -> dict[str, Any]:
        args = prepare_server_args(argv)
        return {"attention_backend": getattr(args, "attention_backend", None),
                "tp_size": args.tp_size}

    return _verdicts(argvs, run)


def _answer_hardware(memory_mb: float, capability: list[int] | None) -> None:
    """The questions SGLang's resolution asks the machine (sglang/srt/utils/common.py:
    get_device, get_device_memory_capacity; torch.cuda.get_device_capability), answered as the
    node's GPUs would answer them: a reference machine has no GPU, and everything else the
    checks read comes from the arguments and the model's config.json."""
    import sglang.srt.utils.common as common

    common.get_device = lambda *args, **kwargs: "cuda"
    common.get_device_memory_capacity = lambda *args, **kwargs: memory_mb
    if capability:
        import torch

        torch.cuda.get_device_capability = lambda *args, **kwargs: tuple(capability)


def _node_files(paths: list[str]) -> None:
    """Files that lie on the node (certificates, key files): the checks that they exist are
    the node's, so here they exist."""
    import os.path

    present = frozenset(paths)
    real_isfile, real_exists = os.path.isfile, os.path.exists
    os.path.isfile = lambda p: p in present or real_isfile(p)
    os.path.exists = lambda p: p in present or real_exists(p)


def _resolve_and_check(argv: list[str]) -> dict[str, Any]:
    """What a server does with its arguments before any worker starts: parse, resolve
    (ServerArgs.resolve_once), check (check_server_args), then publish them as the tokenizer
    process does (runtime_context.publish validates the parallel topology there)."""
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(argv)
    if hasattr(args, "resolve_once"):
        args.resolve_once()
    if hasattr(args, "check_server_args"):
        args.check_server_args()
    try:
        from sglang.srt.runtime_context import publish
    except ImportError:  # a release without the runtime context
        return {"tp_size": args.tp_size}
    publish(args, role="tokenizer")
    return {"tp_size": args.tp_size}


def check(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """cases: {"argv": [...], "gpu_memory_mb": N, "capability": [major, minor] or None,
    "node_paths": [files that lie on the node]}. Each verdict's error is SGLang's final line
    (`AssertionError: ...`, or a bare `AssertionError`). A case that only parses ("parse_only":
    no config.json for its model) gets prepare_server_args' verdict alone."""
    out = []
    _node_files([p for case in cases for p in case.get("node_paths") or ()])
    for case in cases:
        _answer_hardware(case.get("gpu_memory_mb") or 96 * 1024, case.get("capability"))
        run = _prepare_only if case.get("parse_only") else _resolve_and_check
        out.append(_verdicts([case["argv"]], run)[0])
    return out


def _prepare_only(argv: list[str]) -> dict[str, Any]:
    from sglang.srt.server_args import prepare_server_args

    return {"tp_size": prepare_server_args(argv).tp_size}


# ---- a warm probe ---------------------------------------------------------------------------
# Importing SGLang (and transformers and torch with it) is most of a `check`: seconds of CPU
# before the first question. `serve` imports it once, then answers each question on an abstract
# Unix socket in a child forked for it: SGLang's resolution and this probe's stand-ins patch
# module state, and a fork gives each question the state of a fresh import. It answers only its
# own user, and ends after IDLE seconds without a question (or when asked to).

def _own_user(conn: Any) -> bool:
    import os
    import socket
    import struct

    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1] == os.getuid()


def _read_all(conn: Any) -> bytes:
    chunks = []
    while True:
        chunk = conn.recv(1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _answer(conn: Any, server_pid: int) -> None:
    """One question, in the child forked for it: {"command": "check"|"parse"|"prepare"|"stop",
    "payload": ...}, each payload as the one-shot command reads it from stdin."""
    import os
    import signal
    import traceback

    try:
        question = json.loads(_read_all(conn))
        if question.get("command") == "stop":
            # Only the probe that forked this child: one that has already ended leaves the
            # child to another parent, which is never signalled.
            if os.getppid() == server_pid:
                os.kill(server_pid, signal.SIGTERM)
            answer: dict[str, Any] = {"result": "stopping"}
        elif question.get("command") in ANSWERS:
            answer = {"result": ANSWERS[question["command"]](question["payload"])}
        else:
            answer = {"error": f"unknown command {question.get('command')!r}"}
    except Exception:  # noqa: BLE001 - the asker reports it, with the traceback
        answer = {"error": traceback.format_exc()}
    conn.sendall(json.dumps(answer).encode())


# What the warm probe answers, each as its one-shot command does.
ANSWERS = {"check": check, "parse": parse, "prepare": prepare}


def serve(name: str, idle_s: float) -> None:
    import os
    import signal
    import socket

    # What `check` imports before it answers the machine's questions for a case (SGLang, with
    # transformers and torch): the rest (server_args and what the resolution imports) is
    # imported in each question's child after those answers, as in a one-shot `check`, since
    # modules may read the device as they load.
    import sglang.srt.utils.common  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps each question's child
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + name)  # abstract: no file to leave behind; taken: another serves it
    server.listen(16)
    server.settimeout(idle_s)
    server_pid = os.getpid()
    while True:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            return
        if _own_user(conn) and os.fork() == 0:
            server.close()
            # As a fresh process has it: what the checks run is waited for as usual.
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                conn.settimeout(None)
                _answer(conn, server_pid)
            finally:
                os._exit(0)
        conn.close()


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "serve":
        serve(sys.argv[2], float(sys.argv[3]))
        return
    if command == "dump":
        result: Any = dump()
    elif command in ("parse", "prepare"):
        argvs = json.load(sys.stdin)
        result = parse(argvs) if command == "parse" else prepare(argvs)
    elif command == "check":
        result = check(json.load(sys.stdin))
    else:
        raise SystemExit("usage: catalogue_probe.py dump|parse|prepare|check|serve NAME IDLE")
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
