"""Runs INSIDE a reference environment that has a real SGLang release installed (no GPU needed),
never in sglang-fleet's own environment: standard library plus SGLang only.

    <ref python> catalogue_probe.py dump            -> the release's options as JSON
    <ref python> catalogue_probe.py parse  < argvs  -> SGLang's argparse verdict per command line
    <ref python> catalogue_probe.py prepare < argvs -> prepare_server_args() verdict per line
    <ref python> catalogue_probe.py check < cases  -> the post-parse checks' verdict per case

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
    }


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
            "function": last.name, "code": (last.line or "").strip()}


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


def _answer_hardware(memory_mb: float) -> None:
    """The two questions SGLang's resolution asks the machine (sglang/srt/utils/common.py:
    get_device, get_device_memory_capacity), answered as a CUDA node with GPUs of
    `memory_mb` would answer them: a reference machine has no GPU, and everything else the
    checks read comes from the arguments and the model's config.json."""
    import sglang.srt.utils.common as common

    common.get_device = lambda *args, **kwargs: "cuda"
    common.get_device_memory_capacity = lambda *args, **kwargs: memory_mb


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
    """cases: {"argv": [...], "gpu_memory_mb": N}. Each verdict's error is SGLang's final
    line (`AssertionError: ...`, or a bare `AssertionError`)."""
    out = []
    for case in cases:
        _answer_hardware(case.get("gpu_memory_mb", 96 * 1024))
        out.append(_verdicts([case["argv"]], _resolve_and_check)[0])
    return out


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "dump":
        result: Any = dump()
    elif command in ("parse", "prepare"):
        argvs = json.load(sys.stdin)
        result = parse(argvs) if command == "parse" else prepare(argvs)
    elif command == "check":
        result = check(json.load(sys.stdin))
    else:
        raise SystemExit("usage: catalogue_probe.py dump|parse|prepare|check")
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
