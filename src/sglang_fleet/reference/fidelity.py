"""How faithful the toolkit is to real SGLang, measured against the real package.

- the catalogue shipped for a release against what the release's own parser reports;
- the simulator's parser against SGLang's on generated command lines (accept/refuse, and every
  parsed value when both accept);
- every shipped inventory's rendered command line through SGLang's prepare_server_args.

Used by tests/reference (CI) and bench/fidelity.py (docs/sglang-reference.md's table).
"""

from __future__ import annotations

import io
import json
import os
import random
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_fleet.known.catalogue import Catalogue, Option, catalogue_path

PROJECT = Path(__file__).resolve().parents[3]
INVENTORIES = ("inventory/local", "inventory/examples/rtxpro6000-fleet",
               "inventory/examples/tp16-two-nodes", "inventory/examples/pd-deepseek-v3")

# Values by catalogue type: valid ones, and ones SGLang refuses (or mis-reads).
_GOOD = {
    None: ["value", "x-1"], "str": ["value", "/models/m", "a b"], "int": ["8", "0", "-1"],
    "float": ["0.85", "1e-3", "-2"], "loads": ['{"a": 1}', "[1, 2]", "3"],
    "json_list_type": ["[1, 2]", '["a"]'], "nullable_str": ["x", "None", ""],
    "human_readable_int": ["32k", "4096", "1Ki", "2.5k", "1M", " 77 "],
    "parse_cuda_graph_backend_arg": ["full", "breakable", "disabled"],
    "parse_cuda_graph_config_arg": ['{"decode": {"backend": "full", "max_bs": 64}}',
                                    '{"prefill": {"backend": "disabled"}}', "{}"],
}
_BAD = {
    None: [], "str": [], "int": ["eight", "1.5", "32k"], "float": ["fast", "0,85"],
    "loads": ["{bad", "NaN"], "json_list_type": ["[1,", "NaN", "[18446744073709551616]"],
    "nullable_str": [], "human_readable_int": ["1.5Ki", "32K", "k", "1e3"],
    "parse_cuda_graph_backend_arg": ["tc_piecewise", "piecewise"],
    "parse_cuda_graph_config_arg": ["[]", '{"verify": {}}', '{"decode": {"size": 1}}', "{x"],
}
BASE = ["--model-path", "/models/Kimi-K2.5"]


def _values(option: Option, rng: random.Random) -> list[str]:
    if option.choices is not None:
        return [str(rng.choice(option.choices))]
    pool = _GOOD.get(option.type, ["value"])
    if option.nargs in ("+", "*"):
        return [rng.choice(pool) for _ in range(rng.randint(1, 3))]
    return [rng.choice(pool)]


def _spelled(option: Option, rng: random.Random) -> list[str]:
    """One valid use of an option, in one of the spellings people write."""
    flag = rng.choice(option.flags)
    if option.kind == "boolean_optional":
        return [flag]
    if not option.takes_values:
        return [flag]
    values = _values(option, rng)
    if len(values) == 1 and rng.random() < 0.25 and flag.startswith("--"):
        return [f"{flag}={values[0]}"]
    return [flag, *values]


def sample_command_lines(cat: Catalogue, count: int = 400, seed: int = 0) -> list[list[str]]:
    """Command lines as fleets write them, right and wrong: every option used once, then
    realistic combinations and the mistakes people make (typos, abbreviations, bad choices,
    bad types, missing values, values for switches, removed flags, stray words)."""
    rng = random.Random(seed)
    options = [o for o in cat.options if not o.required]
    lines = [list(BASE)]
    for option in options:
        lines.append(BASE + _spelled(option, rng))
    mutations = (_typo, _abbreviation, _bad_choice, _bad_type, _missing_value,
                 _switch_with_value, _removed, _stray, _duplicate, _combination)
    while len(lines) < len(options) + count:
        mutate = rng.choice(mutations)
        line = mutate(cat, options, rng)
        if line is not None:
            lines.append(BASE + line if rng.random() < 0.9 else line)
    return lines


def _typo(cat, options, rng):
    flag = rng.choice(rng.choice(options).flags)
    if len(flag) < 5:
        return None
    i = rng.randrange(2, len(flag))
    return [flag[:i] + flag[i + 1:], "1"]


def _abbreviation(cat, options, rng):
    flag = rng.choice(rng.choice(options).flags)
    if len(flag) < 6:
        return None
    cut = flag[: rng.randint(4, len(flag) - 1)]
    return [cut, "1"] if rng.random() < 0.5 else [cut]


def _bad_choice(cat, options, rng):
    with_choices = [o for o in options if o.choices]
    option = rng.choice(with_choices)
    return [option.name, rng.choice(["not-a-choice", str(option.choices[0]).upper(), ""])]


def _bad_type(cat, options, rng):
    typed = [o for o in options if _BAD.get(o.type) and o.takes_values and not o.choices]
    option = rng.choice(typed)
    return [option.name, rng.choice(_BAD[option.type])]


def _missing_value(cat, options, rng):
    option = rng.choice([o for o in options if o.takes_values])
    return [option.name] if rng.random() < 0.5 else [option.name, "--enable-metrics"]


def _switch_with_value(cat, options, rng):
    option = rng.choice([o for o in options if o.kind in ("store_true", "boolean_optional")])
    flag = rng.choice(option.flags)
    return [f"{flag}=1"] if rng.random() < 0.5 else [flag, "true"]


def _removed(cat, options, rng):
    if not cat.removed:
        return None
    return [rng.choice(sorted(cat.removed)), "8"]


def _stray(cat, options, rng):
    return rng.choice([["stray"], ["--tp-size", "8", "8"], ["-x"], ["--"], ["-5"]])


def _duplicate(cat, options, rng):
    option = rng.choice([o for o in options if o.takes_values and o.nargs is None])
    return _spelled(option, rng) + _spelled(option, rng)


def _combination(cat, options, rng):
    line: list[str] = []
    for option in rng.sample(options, rng.randint(2, 6)):
        line += _spelled(option, rng)
    return line


def json_safe(value: Any) -> Any:
    """Parsed values in the form the reference probe reports them."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((json_safe(v) for v in value), key=repr)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    return {"repr": repr(value)}


def simulator_verdicts(cat: Catalogue, lines: list[list[str]]) -> list[dict[str, Any]]:
    """What the simulator's parser (the catalogue's) says of each line, as the probe reports."""
    parser = cat.build_parser()
    out = []
    for argv in lines:
        try:
            with redirect_stderr(io.StringIO()), redirect_stdout(io.StringIO()):
                values = vars(parser.parse_args(argv))
            out.append({"ok": True, "values": json_safe(values)})
        except SystemExit:
            out.append({"ok": False, "values": None})
        except Exception:  # noqa: BLE001 - a refusal of any kind, as SGLang's
            out.append({"ok": False, "values": None})
    return out


@dataclass
class Agreement:
    lines: int = 0
    verdicts_agree: int = 0
    accepted_by_both: int = 0
    values_agree: int = 0
    disagreements: list[dict[str, Any]] = field(default_factory=list)

    @property
    def verdict_rate(self) -> float:
        return self.verdicts_agree / self.lines if self.lines else 0.0


def compare(lines: list[list[str]], real: list[dict[str, Any]], ours: list[dict[str, Any]]
            ) -> Agreement:
    result = Agreement(lines=len(lines))
    for argv, r, o in zip(lines, real, ours, strict=True):
        if r["ok"] == o["ok"]:
            result.verdicts_agree += 1
            if r["ok"]:
                result.accepted_by_both += 1
                if r["values"] == o["values"]:
                    result.values_agree += 1
                    continue
                diff = sorted(k for k in set(r["values"]) | set(o["values"])
                              if r["values"].get(k) != o["values"].get(k))
                result.disagreements.append({"argv": argv, "values_differ": diff})
            continue
        result.disagreements.append({"argv": argv, "real": r, "simulator": o["ok"]})
    return result


def shipped_catalogue(version: str) -> dict[str, Any]:
    return json.loads(catalogue_path(version).read_text(encoding="utf-8"))


def rendered_server_args(inventory: str) -> dict[str, dict[str, Any]]:
    """Every host's rendered LaunchSpec (server arguments, release) through the render
    playbook, as `sglang-fleet render` builds it. The example inventories read the API key
    from the controller's SGLANG_API_KEY; where it is unset, a placeholder key stands in (the
    parser checks the argument's shape, never the key)."""
    from sglang_fleet.cli.common import RENDER_TASK
    from sglang_fleet.runs.runner import failures, playbook_run, task_results

    extravars = {} if os.environ.get("SGLANG_API_KEY") else \
        {"sglang_server_api_key": "placeholder-key-for-the-parser-check"}
    with playbook_run("playbooks/render.yml", inventory=str(PROJECT / inventory),
                      extravars=extravars) as run:
        results = task_results(run, RENDER_TASK)
        problems = failures(run)
    if problems:
        raise RuntimeError(f"rendering {inventory} failed: {problems}")
    return {host: {"server_args": r["msg"]["spec"]["server_args"],
                   "version": r["msg"]["spec"]["sglang_version"]}
            for host, r in results.items()}
