"""`--config FILE`: SGLang 0.5.23's YAML option file, merged into the command line as SGLang
merges it (sglang/srt/utils/server_args_config_parser.py, called by prepare_server_args).

The rules the simulator keeps, because the deploy relies on them (the server's secrets reach
it only through this file, so that its command line holds only the file's path):

- Only the exact word `--config` triggers the merge (`--config=FILE` parses, but is ignored).
- One `--config` at most, followed by a path ending in .yaml or .yml that exists; else a
  ValueError, uncaught (a traceback, exit status 1).
- The root must be a mapping (an empty file is an empty one). A key is any long spelling of an
  option, `-` or `_`, without the dashes (`api_key`, `api-key`, `tp`/`tp_size` for `--tp`).
- Values become words placed BEFORE the command line's: the command line wins. A boolean
  turns a store_true option on (or leaves it off); any other boolean option gets `true`/
  `false`; a list is the option and its items (an empty one, nothing); a mapping is its JSON;
  anything else is str(value).
- An option of another kind (append, count, ...) is refused: "Unsupported config option ...".
- The merged words exist only inside the process: its command line (/proc/PID/cmdline) is the
  one it was started with, and its workers are started with that same one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

FLAG = "--config"


def _keys(action: argparse.Action) -> set[str]:
    return {action.dest} | {o[2:].replace("-", "_") for o in action.option_strings
                            if o.startswith("--")}


def _single_valued(action: argparse.Action) -> bool:
    return isinstance(action, argparse._StoreAction) or action.nargs is None


class ConfigMerger:
    """The option kinds of one parser, and the merge of a config file into its argv."""

    def __init__(self, parser: argparse.ArgumentParser):
        actions = parser._actions
        self.switches = {k for a in actions if isinstance(a, argparse._StoreTrueAction)
                         for k in _keys(a)}
        supported = [a for a in actions
                     if isinstance(a, argparse._StoreTrueAction) or _single_valued(a)]
        supported_keys = {k for a in supported for k in _keys(a)}
        skipped = {FLAG, "--help", "-h"}
        self.unsupported = {k: a for a in actions
                            if a.option_strings and a not in supported
                            and not skipped & set(a.option_strings)
                            for k in _keys(a) if k not in supported_keys}

    def merge(self, argv: list[str]) -> list[str]:
        path = config_path(argv)
        if not path:
            return argv
        words = self.words(read_config(path))
        at = argv.index(FLAG)
        return words + argv[:at] + argv[at + 2:]

    def words(self, config: dict[str, Any]) -> list[str]:
        out: list[str] = []
        for key, value in config.items():
            norm = key.replace("-", "_")
            if norm in self.unsupported:
                raise ValueError(f"Unsupported config option '{norm}' with action "
                                 f"'{self.unsupported[norm].__class__.__name__}'")
            if isinstance(value, bool):
                if norm not in self.switches:
                    out += [f"--{key}", str(value).lower()]
                elif value:
                    out.append(f"--{key}")
            elif isinstance(value, list):
                out += [f"--{key}", *(str(item) for item in value)] if value else []
            elif isinstance(value, dict):
                out += [f"--{key}", json.dumps(value)]
            else:
                out += [f"--{key}", str(value)]
        return out


def config_path(argv: list[str]) -> str | None:
    at = [i for i, word in enumerate(argv) if word == FLAG]
    if len(at) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    if not at:
        return None
    if at[0] == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    return argv[at[0] + 1]


def read_config(path: str) -> dict[str, Any]:
    suffix = Path(path).suffix
    if suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {suffix}")
    if not Path(path).exists():
        raise ValueError(f"Config file not found: {path}")
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except Exception as exc:
        # SGLang logs this before logging is configured: Python's last-resort handler prints
        # the bare message to stderr.
        sys.stderr.write(f"Failed to read config file {path}: {exc}\n")
        raise
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    return data
