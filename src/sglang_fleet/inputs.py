"""What the command line is given, checked before Ansible starts: the inventory's YAML files and
the -e extra variables. Each is read with bounded cost (alias expansion is counted, never
performed), and a problem is reported with the file or option, the real error and the fix.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import yaml

from sglang_fleet_node.sglang_fleet_secrets import SECRET_NAMES, SECRET_PREFIXES

# Values that YAML aliases may add when expanded: a real inventory shares a few blocks of
# settings this way; an alias bomb (nine levels of ten aliases) adds a billion.
MAX_ALIAS_EXPANSION = 100_000
# Files Ansible reads as YAML: inventory sources by extension; vars files also without one.
YAML_EXTENSIONS = (".yml", ".yaml", ".json")
# Inventory entries Ansible skips (ansible-core's REJECT_EXTS and INVENTORY_IGNORE_EXTS).
_IGNORED = re.compile(r"^\.|(\.pyc|\.pyo|\.swp|\.bak|~|\.rpm|\.md|\.txt|\.rst|\.orig|\.cfg|"
                      r"\.retry)$")
_VARS_FOLDERS = ("group_vars", "host_vars")


class InputError(Exception):
    """A refused input: the message names the file or option, the problem and the fix."""

    def __init__(self, message: str, fix: str = ""):
        super().__init__(message)
        self.fix = fix


def yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error as one line: where, what, and the construct it was reading."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return " ".join(str(exc).split())
    mark = exc.problem_mark
    text = f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    if exc.context:
        start = exc.context_mark
        text += f" ({exc.context}" + (f" that starts at line {start.line + 1}, column "
                                      f"{start.column + 1})" if start else ")")
    return text


def _node_sizes(root: yaml.Node) -> tuple[int, int]:
    """(distinct nodes, nodes once every alias is expanded), counted without expanding."""
    sizes: dict[int, int] = {}
    busy: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in busy:
            raise InputError("an alias refers to a value that contains it (a cycle)")
        busy.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        busy.discard(key)
        sizes[key] = total
        return total

    expanded = size(root)
    return len(sizes), expanded


def compose_bounded(text: str, name: str) -> list[yaml.Node]:
    """The YAML documents of `text` as nodes, refused when their aliases would expand to more
    than MAX_ALIAS_EXPANSION extra values. Composing is linear in the text; nothing is
    expanded or constructed."""
    stream = io.StringIO(text)
    stream.name = name  # PyYAML names the source in its error marks
    try:
        documents = [d for d in yaml.compose_all(stream, Loader=yaml.SafeLoader)
                     if d is not None]
        for document in documents:
            distinct, expanded = _node_sizes(document)
            if expanded - distinct > MAX_ALIAS_EXPANSION:
                raise InputError(
                    f"its YAML aliases expand {distinct:,} values into {expanded:,} (more than "
                    f"{MAX_ALIAS_EXPANSION:,} added by aliases: an alias bomb?)",
                    fix="write the values out, or share fewer of them through aliases")
    except yaml.YAMLError as exc:
        raise InputError(f"not valid YAML: {yaml_problem(exc)}") from None
    except RecursionError:
        raise InputError("values nested too deeply to read") from None
    return documents


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InputError(f"not valid UTF-8: byte 0x{data[exc.start]:02x} at line {line}, "
                         f"column {column}") from None


def _is_vault(data: bytes) -> bool:
    # Encrypted with ansible-vault: YAML only once decrypted, which the controller does later.
    return data.lstrip().startswith(b"$ANSIBLE_VAULT")


def inventory_yaml_files(inventory: Path) -> list[Path]:
    """The files Ansible reads as YAML for an inventory: YAML inventory sources (a file, or a
    folder's files, recursively) and every group_vars/ and host_vars/ file beside them."""
    sources: list[Path] = []
    folder = inventory.parent if inventory.is_file() else inventory

    def walk_sources(path: Path) -> None:
        for entry in sorted(path.iterdir()):
            if _IGNORED.search(entry.name) or entry.name in _VARS_FOLDERS:
                continue
            if entry.is_dir():
                walk_sources(entry)
            elif entry.suffix in YAML_EXTENSIONS:
                sources.append(entry)

    if inventory.is_file():
        if inventory.suffix in YAML_EXTENSIONS:
            sources.append(inventory)
    elif inventory.is_dir():
        walk_sources(inventory)
    for name in _VARS_FOLDERS:
        base = folder / name
        if base.is_dir():
            sources += sorted(p for p in base.rglob("*") if p.is_file()
                              and not any(part.startswith(".") for part in
                                          p.relative_to(base).parts)
                              and not p.name.endswith("~")
                              and (p.suffix in YAML_EXTENSIONS or not p.suffix))
    return sources


def check_inventory_files(inventory: Path) -> int:
    """Refuse an inventory whose YAML Ansible could not read, or could read only at a cost
    without bound. Returns the number of files checked."""
    files = inventory_yaml_files(inventory)
    for path in files:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InputError(f"inventory file {path}: cannot read it: {exc.strerror}") from None
        if _is_vault(data):
            continue
        try:
            compose_bounded(_decode(data), str(path))
        except InputError as exc:
            fix = exc.fix or "correct the file: Ansible cannot read it"
            raise InputError(f"inventory file {path}: {exc}. Fix: {fix}") from None
    return len(files)


# ---- -e extra variables --------------------------------------------------------------------

def _utf8(item: str) -> str:
    """An argument as text. Bytes that are not UTF-8 reach Python as lone surrogates."""
    try:
        item.encode("utf-8")
    except UnicodeEncodeError as exc:
        raw = item.encode("utf-8", "surrogateescape")
        raise InputError(f"-e: not valid UTF-8: byte 0x{raw[exc.start]:02x} at position "
                         f"{exc.start + 1}. Fix: pass the value as UTF-8 text") from None
    return item


def _load_value(text: str, where: str) -> Any:
    try:
        documents = compose_bounded(text, where)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    if not documents:
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{where}: not valid YAML: {yaml_problem(exc)}") from None


def _secret_paths(value: Any, path: str) -> list[str]:
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            # The toolkit's own secrets (the registry): a secret given with -e at any depth.
            if key in SECRET_NAMES or str(key).startswith(SECRET_PREFIXES):
                found.append(here)
            found += _secret_paths(item, here)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _secret_paths(item, f"{path}[{i}]")
    return found


def parse_extra_vars(items: list[str] | None) -> dict[str, Any]:
    """-e as ansible-playbook takes it: JSON/YAML mappings or key=value pairs. Refused with
    exit 2 (InputError): text that is not UTF-8, YAML or JSON that does not parse or whose
    aliases expand without bound, and a secret at any depth (sglang_server_api_key inside
    sglang_server_overrides as much as at the top)."""
    out: dict[str, Any] = {}
    for item in items or []:
        text = _utf8(item).strip()
        if text.startswith("@"):
            raise InputError(f"-e {text[:60]!r}: files of variables are not taken here. Fix: "
                             f"put the variables in the inventory, or pass them as JSON")
        if text.startswith("{"):
            value = _load_value(text, "-e (JSON/YAML mapping)")
            if not isinstance(value, dict):
                raise InputError(f"-e {text[:60]!r}: not a mapping. Fix: pass a JSON object, "
                                 f"e.g. -e '{{\"sglang_server_tp\": 8}}'")
            out.update(value)
            continue
        for pair in text.split():
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise InputError(f"-e {pair[:60]!r}: expected key=value or a JSON mapping")
            out[key] = _load_value(value, f"-e {key}") if value else ""
    secret = _secret_paths(out, "")
    if secret:
        raise InputError(
            f"-e {', '.join(secret)}: a secret on the command line ends up in the runner "
            f"artifacts and the shell history, and inside sglang_server_overrides it is not "
            f"even used as a secret. Fix: set sglang_server_api_key / sglang_server_hf_token "
            f"in the inventory (the router's API keys likewise), encrypted with ansible-vault")
    return out
