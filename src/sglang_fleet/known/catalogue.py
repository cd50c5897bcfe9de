"""The flag catalogue of each SGLang release, generated from the release's own parser.

A release's catalogue is built from its package on the controller, on first use or by
`sglang-fleet release add VERSION`, and cached there (release_cache: <root>/catalogue/
sglang-VERSION.json): every option with its flags (aliases included), destination, argparse
kind, type, nargs, choices, default and deprecation. Nobody types SGLang's flags from memory:
validation (`check_args`), rendering and the simulator's parser (`build_parser`) all read this.
The package carries the catalogues of the releases its own tests run against (data/catalogue,
checked against the packages by tests/reference), for a controller that has built none yet;
a catalogue built from the package wins. A flag of an older known release that this one lacks
is "removed".
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

from sglang_fleet.known import release_cache

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's own test


@dataclass(frozen=True)
class CatalogueFiles:
    """Where one program's shipped catalogues lie: `<folder>/<stem>-VERSION.json`, one per
    release (SGLang's here, sglang-router's in router_catalogue)."""

    folder: Path
    stem: str

    def path(self, version: str) -> Path:
        return self.folder / f"{self.stem}-{version}.json"

    def versions(self) -> tuple[str, ...]:
        """Releases with a catalogue, oldest first."""
        from packaging.version import Version

        names = [p.name.removeprefix(f"{self.stem}-").removesuffix(".json")
                 for p in self.folder.glob(f"{self.stem}-*.json")]
        return tuple(sorted(names, key=Version))

    def known_versions(self) -> tuple[str, ...]:
        """Releases with a catalogue on this controller (read from their package into the
        release cache, or shipped), oldest first."""
        from packaging.version import Version

        return tuple(sorted(set(self.versions()) | set(release_cache.cached_versions(self.stem)),
                            key=Version))

    def source(self, version: str) -> Path | None:
        """The file a release's catalogue is read from: the one built from its package on
        this controller, else the one the toolkit ships; None when there is neither."""
        for path in (release_cache.catalogue_file(self.stem, version), self.path(version)):
            if path.exists():
                return path
        return None

    def write(self, dump: dict[str, Any], version: str) -> Path:
        """Store one release's catalogue whole or not at all (a reader never sees half)."""
        return release_cache.write_json(self.path(version), dump)


FILES = CatalogueFiles(Path(__file__).resolve().parents[1] / "data" / "catalogue", "sglang")
CATALOGUE_DIR = FILES.folder


def catalogue_path(version: str) -> Path:
    return FILES.path(version)


def write_catalogue(dump: dict[str, Any]) -> Path:
    return FILES.write(dump, dump["sglang_version"])


@cache
def shipped_versions() -> tuple[str, ...]:
    """Releases with a catalogue in the package, oldest first."""
    return FILES.versions()


@cache
def known_versions() -> tuple[str, ...]:
    """Releases with a catalogue on this controller (cached or shipped), oldest first."""
    return FILES.known_versions()


def catalogue_source(version: str) -> Path | None:
    return FILES.source(version)


def forget_catalogues() -> None:
    """After a release was added: the next lookups read the cache again."""
    for cached in (known_versions, _raw, catalogue):
        cached.cache_clear()


# ---- SGLang's argparse types, re-implemented exactly (each names its source) ----------------

def _human_readable_int(value: str) -> int:
    # sglang/srt/utils/common.py: human_readable_int (0.5.23)
    value = value.strip()
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. Use an "
                    f"integer IEC value such as '{int(Decimal(number))}{suffix}', or an SI "
                    f"value such as '{number}{suffix[0]}'.")
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. Use a plain integer, SI suffixes (1k, 1M), or "
            f"IEC suffixes (1Ki, 1Mi). Suffixes are case-sensitive.") from None


def _orjson_loads(value: str) -> Any:
    # SGLang parses these with orjson, which refuses NaN/Infinity and integers beyond 64 bits.
    def no_constant(name: str) -> Any:
        raise json.JSONDecodeError(f"{name} is not valid JSON", value, 0)

    def bounded_int(text: str) -> int:
        number = int(text)
        if not -(2**63) <= number < 2**64:
            raise json.JSONDecodeError("Integer exceeds 64-bit range", value, 0)
        return number

    return json.loads(value, parse_constant=no_constant, parse_int=bounded_int)


def _json_list_type(value: str) -> Any:
    # sglang/srt/utils/common.py: json_list_type (0.5.4.post3 and 0.5.23)
    try:
        return _orjson_loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(
            f"Invalid JSON list: {value}. Please provide a valid JSON list.") from None


def _nullable_str(val: str) -> str | None:
    # sglang/srt/utils/common.py: nullable_str
    if not val or val == "None":
        return None
    return val


def _parse_cuda_graph_backend_arg(raw: str) -> str:
    # sglang/srt/model_executor/cuda_graph_config.py: parse_cuda_graph_backend_arg (0.5.23)
    if raw == "tc_piecewise":
        raise argparse.ArgumentTypeError(
            "tc_piecewise was removed; select breakable, full, or disabled")
    return raw


# sglang/srt/model_executor/cuda_graph_config.py: Phase.ALL and ALLOWED_KEYS_PER_PHASE (0.5.23)
_CUDA_GRAPH_PHASE_KEYS = {
    "decode": ("backend", "max_bs", "bs"),
    "prefill": ("backend", "max_bs", "bs", "max_context_size", "full_prefill_max_req",
                "full_prefill_prefix_chunk_tokens", "max_seq_len"),
}


def _parse_cuda_graph_config_arg(raw: str) -> dict[str, dict[str, Any]]:
    # sglang/srt/model_executor/cuda_graph_config.py: parse_cuda_graph_config_arg (0.5.23)
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(
            f"--cuda-graph-config must be a JSON object, got {type(parsed).__name__}")
    phases = tuple(_CUDA_GRAPH_PHASE_KEYS)
    result: dict[str, dict[str, Any]] = {}
    for phase, settings in parsed.items():
        phase = str(phase)
        if phase not in phases:
            raise argparse.ArgumentTypeError(
                f"--cuda-graph-config: unknown phase '{phase}', expected one of {phases}")
        if not isinstance(settings, dict):
            raise argparse.ArgumentTypeError(
                f"--cuda-graph-config['{phase}'] must be a JSON object, got "
                f"{type(settings).__name__}")
        if "backend" in settings:
            _parse_cuda_graph_backend_arg(settings["backend"])
        allowed = _CUDA_GRAPH_PHASE_KEYS[phase]
        result[phase] = {}
        for key, value in settings.items():
            if key not in allowed:
                raise argparse.ArgumentTypeError(
                    f"--cuda-graph-config['{phase}']: unknown key '{key}', expected one of "
                    f"{allowed}")
            result[phase][key] = value
    return result


def _named(function: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    function.__name__ = name  # argparse names the type in "invalid <type> value"
    return function


# The catalogue's "type" (the callable's __name__ in SGLang) -> the same conversion here.
CONVERTERS: dict[str, Callable[[str], Any]] = {
    "str": str,
    "int": int,
    "float": float,
    "loads": _named(json.loads, "loads"),
    "human_readable_int": _named(_human_readable_int, "human_readable_int"),
    "json_list_type": _named(_json_list_type, "json_list_type"),
    "nullable_str": _named(_nullable_str, "nullable_str"),
    "parse_cuda_graph_backend_arg": _named(_parse_cuda_graph_backend_arg,
                                           "parse_cuda_graph_backend_arg"),
    "parse_cuda_graph_config_arg": _named(_parse_cuda_graph_config_arg,
                                          "parse_cuda_graph_config_arg"),
}


# How a refusal names what a value should be, per catalogue type.
TYPE_WORDS = {
    None: "a value", "str": "a string", "int": "an integer", "float": "a number",
    "loads": "JSON", "json_list_type": "a JSON list", "nullable_str": "a string",
    "human_readable_int": "an integer (suffixes such as 32k or 1Ki allowed)",
    "parse_cuda_graph_backend_arg": "a CUDA-graph backend name",
    "parse_cuda_graph_config_arg": "a JSON object of per-phase CUDA-graph settings",
}


# ---- SGLang's custom argparse actions (sglang/srt/arg_groups/argparse_actions.py) -----------

def _deprecation_warning(option: str | None, new_flag: str | None) -> None:
    replacement = f" Use '{new_flag}' instead." if new_flag else ""
    print(f"'{option}' is deprecated and will be removed in a future release.{replacement}",
          file=sys.stderr)


class LoRAPathAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        lora_paths: list[Any] = []
        if values:
            assert isinstance(values, list), "Expected a list of LoRA paths."
            for lora_path in values:
                lora_path = lora_path.strip()
                if lora_path.startswith("{") and lora_path.endswith("}"):
                    obj = json.loads(lora_path)
                    assert "lora_path" in obj and "lora_name" in obj, (
                        f"{lora_path!r} looks like a JSON str, but it does not contain "
                        "'lora_name' and 'lora_path' keys.")
                    lora_paths.append(obj)
                else:
                    lora_paths.append(lora_path)
        setattr(namespace, self.dest, lora_paths)


class DeprecatedStoreTrueAction(argparse.Action):
    def __init__(self, option_strings, dest, new_flag=None, nargs=0, const=True,
                 default=False, **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default,
                         **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        _deprecation_warning(option_string, self.new_flag)
        setattr(namespace, self.dest, True)


class DeprecatedStoreConstAction(argparse.Action):
    def __init__(self, option_strings, dest, new_flag=None, const_value=None, nargs=0,
                 default=None, **kwargs):
        self.new_flag = new_flag
        self.const_value = const_value
        super().__init__(option_strings, dest, nargs=nargs, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        _deprecation_warning(option_string, self.new_flag)
        setattr(namespace, self.dest, self.const_value)


class DeprecatedAliasStoreAction(argparse.Action):
    def __init__(self, option_strings, dest, new_flag=None, **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        _deprecation_warning(option_string, self.new_flag)
        setattr(namespace, self.dest, values)


class DeprecatedAction(argparse.Action):
    def __init__(self, option_strings, dest, error_message=None, nargs=0, **kwargs):
        self.error_message = error_message
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        if self.error_message is not None:
            parser.error(self.error_message)
        print(f"The command line argument '{option_string}' is deprecated and will be removed "
              f"in future versions.", file=sys.stderr)


# ---- the catalogue ----------------------------------------------------------------------

@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]
    dest: str
    kind: str
    type: str | None
    nargs: Any
    choices: tuple[Any, ...] | None
    default: Any
    required: bool = False
    const: Any = None
    new_flag: str | None = None
    const_value: Any = None
    error_message: str | None = None

    @property
    def name(self) -> str:
        """The flag people write: the first spelling SGLang registers."""
        return self.flags[0]

    @property
    def deprecated(self) -> bool:
        return self.kind.startswith("deprecated")

    @property
    def takes_values(self) -> bool:
        return self.nargs != 0 and self.kind not in (
            "store_true", "store_false", "store_const", "count", "boolean_optional")

    def convert(self, value: str) -> Any:
        if self.type is None:
            return value
        return CONVERTERS[self.type](value)


@dataclass
class ArgProblem:
    token: str
    problem: str
    fix: str


@dataclass
class ArgsCheck:
    """What check_args found: problems (refusals), warnings, and which flag set each dest."""

    problems: list[ArgProblem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    dests: dict[str, str] = field(default_factory=dict)
    values: dict[str, list[Any]] = field(default_factory=dict)


class ParseError(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise ParseError(message)


class Catalogue:
    def __init__(self, data: dict[str, Any], removed: Iterable[str] = ()):
        self.version: str = data["sglang_version"]
        self.prog: str = data.get("prog", "sglang serve")
        self.allow_abbrev: bool = data.get("allow_abbrev", True)
        self.options: list[Option] = []
        for entry in data["options"]:
            choices = entry.get("choices")
            self.options.append(Option(
                flags=tuple(entry["flags"]), dest=entry["dest"], kind=entry["kind"],
                type=entry.get("type"), nargs=entry.get("nargs"),
                choices=tuple(choices) if choices is not None else None,
                default=entry.get("default"), required=entry.get("required", False),
                const=entry.get("const"), new_flag=entry.get("new_flag"),
                const_value=entry.get("const_value"),
                error_message=entry.get("error_message")))
        self.by_flag: dict[str, Option] = {f: o for o in self.options for f in o.flags}
        self.by_dest: dict[str, Option] = {}
        for option in self.options:
            self.by_dest.setdefault(option.dest, option)
        # The environment variables the release declares it reads (empty where the catalogue
        # predates recording them).
        self.environment: frozenset[str] = frozenset(
            e["name"] for e in data.get("environment") or ())
        # Flags an older shipped release had and this one lacks.
        self.removed: frozenset[str] = frozenset(removed)
        self._raising_parser: argparse.ArgumentParser | None = None
        unknown = {o.type for o in self.options if o.type is not None} - set(CONVERTERS)
        if unknown:
            raise ValueError(f"SGLang {self.version} uses argparse types this toolkit does not "
                             f"model: {sorted(unknown)}; add them to CONVERTERS")

    # -- lookups --------------------------------------------------------------------------
    def choices_of(self, dest: str) -> tuple[Any, ...] | None:
        option = self.by_dest.get(dest)
        return option.choices if option else None

    def default_of(self, dest: str) -> Any:
        option = self.by_dest.get(dest)
        return option.default if option else None

    def suggest(self, flag: str) -> list[str]:
        return difflib.get_close_matches(flag, list(self.by_flag), n=3, cutoff=0.7)

    @cache  # noqa: B019 - a catalogue lives as long as the process
    def replacements(self, flag: str) -> list[str]:
        """The current flags that replace a removed one: those it prefixes (where SGLang
        renamed it), else those that resemble it. Asked only when a removed flag is used:
        comparing every removed flag with every current one takes a tenth of a second."""
        starts = sorted(f for f in self.by_flag if f.startswith(flag + "-"))
        return starts or difflib.get_close_matches(flag, sorted(self.by_flag), n=2, cutoff=0.9)

    def diagnose_flag(self, flag: str) -> ArgProblem:
        """Why a flag that is not an exact name of this release is refused, with the fix."""
        if flag in self.removed:
            hint = self.replacements(flag)
            fix = (f"use {' or '.join(hint)}" if hint else
                   "drop it (it has no replacement)")
            return ArgProblem(flag, f"{flag} was removed in SGLang {self.version}", fix)
        prefixed = sorted(f for f in self.by_flag if f.startswith(flag) and flag.startswith("--"))
        owners = {self.by_flag[f].dest for f in prefixed}
        if len(owners) == 1:
            full = self.by_flag[prefixed[0]].name
            return ArgProblem(flag, f"{flag} is an abbreviation of {full}",
                              f"write the full flag name {full}")
        if prefixed:
            return ArgProblem(flag, f"{flag} is ambiguous in SGLang {self.version} (could be "
                              f"{', '.join(prefixed[:6])}{', ...' if len(prefixed) > 6 else ''})",
                              "write the full flag name")
        close = self.suggest(flag)
        fix = f"did you mean {' or '.join(close)}?" if close else (
            f"see `sglang serve --help` for SGLang {self.version}")
        return ArgProblem(flag, f"{flag} is not an option of SGLang {self.version}", fix)

    # -- checking a command line ----------------------------------------------------------
    def check_args(self, tokens: Sequence[str]) -> ArgsCheck:
        """Check server arguments flag by flag: exact names only (no abbreviations), value
        counts, types, choices, deprecated (warning) and removed (refused) flags."""
        result = ArgsCheck()
        i = 0
        while i < len(tokens):
            token = tokens[i]
            i += 1
            if not _looks_like_flag(token):
                result.problems.append(ArgProblem(token, f"{token!r} is a value with no flag "
                                                  "before it", "put it after its flag"))
                continue
            flag, eq, inline = token.partition("=") if token.startswith("--") else (
                token, "", "")
            option = self.by_flag.get(flag)
            values: list[str] = [inline] if eq else []
            if option is None:
                result.problems.append(self.diagnose_flag(flag))
                while i < len(tokens) and not _looks_like_flag(tokens[i]):
                    i += 1  # its values: one problem per unknown flag, not one per word
                continue
            if not option.takes_values:
                if eq:
                    result.problems.append(ArgProblem(token, f"{flag} takes no value",
                                                      f"write {flag} alone"))
            elif not eq:
                limit = 1 if option.nargs in (None, "?") else (
                    option.nargs if isinstance(option.nargs, int) else len(tokens))
                while i < len(tokens) and len(values) < limit and not _looks_like_flag(
                        tokens[i]):
                    values.append(tokens[i])
                    i += 1
                wanted = option.nargs
                if (wanted is None or wanted == "+") and not values:
                    result.problems.append(ArgProblem(token, f"{flag} expects a value",
                                                      f"give {flag} its value"))
                elif isinstance(wanted, int) and len(values) != wanted:
                    result.problems.append(ArgProblem(token, f"{flag} expects {wanted} values",
                                                      f"give {flag} {wanted} values"))
            converted = self._converted(option, flag, values, result)
            if option.deprecated:
                replacement = f"; use {option.new_flag}" if option.new_flag else ""
                result.warnings.append(f"{flag} is deprecated in SGLang {self.version}"
                                       f"{replacement}")
            if option.dest in result.dests and result.dests[option.dest] != flag:
                result.problems.append(ArgProblem(
                    token, f"{flag} and {result.dests[option.dest]} set the same option "
                    f"({option.dest})", "give it once"))
            result.dests.setdefault(option.dest, flag)
            result.values[option.dest] = converted
        return result

    def _converted(self, option: Option, flag: str, values: list[str],
                   result: ArgsCheck) -> list[Any]:
        """The values in the option's type; a value it refuses is a problem of `result`."""
        converted = []
        for value in values:
            try:
                converted.append(option.convert(value))
            except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
                detail = str(exc) or f"not a valid {option.type}"
                result.problems.append(ArgProblem(
                    f"{flag} {value}", f"{value!r} is not a valid value for {flag} "
                    f"({detail})", f"give {flag} {TYPE_WORDS.get(option.type, 'a value')}"))
                continue
            if option.choices is not None and converted[-1] not in option.choices:
                result.problems.append(ArgProblem(
                    f"{flag} {value}", f"{value!r} is not a choice of {flag} in SGLang "
                    f"{self.version}", f"use one of: "
                    f"{', '.join(str(c) for c in option.choices)}"))
        return converted

    # -- the parser itself ----------------------------------------------------------------
    def build_parser(self, raising: bool = False) -> argparse.ArgumentParser:
        """An argparse parser that accepts and refuses what SGLang's does. With raising=True
        errors raise ParseError instead of exiting."""
        cls = _RaisingParser if raising else argparse.ArgumentParser
        parser = cls(prog=self.prog, allow_abbrev=self.allow_abbrev)
        for o in self.options:
            _add_option(parser, o)
        return parser

    def parse(self, argv: Sequence[str]) -> argparse.Namespace:
        """Parse like SGLang; raises ParseError with argparse's message on refusal."""
        if self._raising_parser is None:
            self._raising_parser = self.build_parser(raising=True)
        return self._raising_parser.parse_args(list(argv))


def _looks_like_flag(token: str) -> bool:
    return token.startswith("-") and token != "-" and not _NEGATIVE_NUMBER.match(token)


def _add_option(parser: argparse.ArgumentParser, o: Option) -> None:
    common: dict[str, Any] = {"dest": o.dest, "default": o.default}
    if o.required:
        common["required"] = True
    converter = CONVERTERS[o.type] if o.type else None
    kind = o.kind
    if kind == "store":
        extra: dict[str, Any] = {}
        if o.nargs is not None:
            extra["nargs"] = o.nargs
        if o.const is not None:
            extra["const"] = o.const
        parser.add_argument(*o.flags, type=converter, choices=o.choices, **extra, **common)
    elif kind in ("store_true", "store_false", "count"):
        parser.add_argument(*o.flags, action=kind, **common)
    elif kind in ("store_const", "append"):
        parser.add_argument(*o.flags, action=kind, const=o.const, **common)
    elif kind == "boolean_optional":
        positive = [f for f in o.flags if not f.startswith("--no-")]
        parser.add_argument(*positive, action=argparse.BooleanOptionalAction, **common)
    elif kind == "deprecated_store_true":
        parser.add_argument(*o.flags, action=DeprecatedStoreTrueAction, new_flag=o.new_flag,
                            **common)
    elif kind == "deprecated_store_const":
        parser.add_argument(*o.flags, action=DeprecatedStoreConstAction, new_flag=o.new_flag,
                            const_value=o.const_value, nargs=o.nargs, choices=o.choices,
                            type=converter, **common)
    elif kind == "deprecated_alias":
        parser.add_argument(*o.flags, action=DeprecatedAliasStoreAction, new_flag=o.new_flag,
                            nargs=o.nargs, choices=o.choices, type=converter, **common)
    elif kind == "deprecated":
        parser.add_argument(*o.flags, action=DeprecatedAction, error_message=o.error_message,
                            nargs=o.nargs, **common)
    elif kind == "lora_paths":
        parser.add_argument(*o.flags, action=LoRAPathAction, nargs=o.nargs, type=converter,
                            **common)
    else:
        raise ValueError(f"unknown option kind {kind!r} for {o.flags}")


@cache
def _raw(version: str) -> dict[str, Any]:
    path = catalogue_source(version)
    if path is None:
        raise KeyError(f"no catalogue for SGLang {version}; known: "
                       f"{', '.join(known_versions())} (sglang-fleet release add {version})")
    return json.loads(path.read_text(encoding="utf-8"))


@cache
def catalogue(version: str) -> Catalogue:
    """The catalogue of one release, with the flags removed since the older known ones."""
    data = _raw(version)
    versions = known_versions()
    current = {f for o in data["options"] for f in o["flags"]}
    removed = {flag for older in (versions[:versions.index(version)]
                                  if version in versions else ())
               for entry in _raw(older)["options"] for flag in entry["flags"]} - current
    return Catalogue(data, removed)
