"""What the command line is given, checked before Ansible starts: the inventory's YAML files and
the -e extra variables. Each is read with bounded cost (alias expansion is counted, never
performed), and a problem is reported with the file or option, the real error and the fix.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from sglang_fleet.node.common.secrets import SECRET_NAMES, SECRET_PREFIXES

# Values that YAML aliases may add when expanded: a real inventory shares a few blocks of
# settings this way; an alias bomb (nine levels of ten aliases) adds a billion.
MAX_ALIAS_EXPANSION = 100_000
# Files Ansible reads as YAML: inventory sources by extension; vars files also without one.
YAML_EXTENSIONS = (".yml", ".yaml", ".json")
# Inventory entries Ansible skips (ansible-core's REJECT_EXTS and INVENTORY_IGNORE_EXTS).
_IGNORED = re.compile(r"^\.|(\.pyc|\.pyo|\.swp|\.bak|~|\.rpm|\.md|\.txt|\.rst|\.orig|\.cfg|"
                      r"\.retry)$")
_VARS_FOLDERS = ("group_vars", "host_vars")
# The tags Ansible's YAML loader constructs (ansible-core's constructor: YAML's own types,
# !unsafe and !vault). Any other tag, !!python/object among them, is refused here, by name,
# before Ansible's loader fails on it.
SAFE_TAGS = frozenset({f"tag:yaml.org,2002:{name}" for name in (
    "null", "bool", "int", "float", "binary", "timestamp", "omap", "pairs", "set", "str", "seq",
    "map", "merge", "value", "python/dict", "python/unicode")}
    | {"!unsafe", "!vault", "!vault-encrypted"})
# One setting's value, bounded: the spec checks and Ansible's templating cost grow with it (a
# 200,000-item list took minutes to check). No SGLang setting comes near these sizes.
MAX_ITEMS = 1_000  # entries of one list or mapping in a setting
MAX_VALUES = 10_000  # values in one setting, at every depth, aliases expanded
MAX_CHARS = 1_048_576  # characters of one string
# libyaml composes ten times faster; its errors are read again with PyYAML for their wording.
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


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
    try:
        documents = _compose(text, name)
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


def _compose(text: str, name: str) -> list[yaml.Node]:
    try:
        return [d for d in yaml.compose_all(text, Loader=_FAST_LOADER) if d is not None]
    except yaml.YAMLError:
        if _FAST_LOADER is yaml.SafeLoader:
            raise
    stream = io.StringIO(text)
    stream.name = name  # PyYAML names the source in its error marks
    return [d for d in yaml.compose_all(stream, Loader=yaml.SafeLoader) if d is not None]


def _key(node: yaml.Node) -> str:
    return str(node.value) if isinstance(node, yaml.ScalarNode) else "?"


def _where(node: yaml.Node) -> str:
    mark = node.start_mark
    return f" (line {mark.line + 1})" if mark is not None else ""


def _tags_refused(node: yaml.Node, path: str, seen: set[int]) -> None:
    """Refuse any tag Ansible cannot construct, naming where it is."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if node.tag not in SAFE_TAGS:
        tag = node.tag.replace("tag:yaml.org,2002:", "!!")
        raise InputError(
            f"{path or 'the document'}: the YAML tag {tag}{_where(node)} is not one Ansible "
            "reads (it reads YAML's own types, !unsafe and !vault)",
            fix="remove the tag and write the value as plain YAML")
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _tags_refused(item, f"{path}[{i}]", seen)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            _tags_refused(key, path, seen)
            _tags_refused(value, f"{path}.{_key(key)}" if path else _key(key), seen)


def _group_variables(group: yaml.Node) -> Iterator[tuple[str, yaml.Node]]:
    """The variables an inventory source's group sets: its vars, its hosts', its children's."""
    if not isinstance(group, yaml.MappingNode):
        return
    for key, value in group.value:
        if not isinstance(value, yaml.MappingNode):
            continue
        if _key(key) == "vars":
            yield from ((_key(k), v) for k, v in value.value)
        elif _key(key) == "hosts":
            for _, host in value.value:
                if isinstance(host, yaml.MappingNode):
                    yield from ((_key(k), v) for k, v in host.value)
        elif _key(key) == "children":
            for _, child in value.value:
                yield from _group_variables(child)


def variables(document: yaml.Node, vars_file: bool) -> Iterator[tuple[str, yaml.Node]]:
    """(name, value) of each variable a document sets: a vars file's top-level keys, or what
    an inventory source's groups and hosts set."""
    if not isinstance(document, yaml.MappingNode):
        return
    if vars_file:
        yield from ((_key(k), v) for k, v in document.value)
    else:
        for _, group in document.value:
            yield from _group_variables(group)


def _too_big(node: yaml.Node, path: str, seen: set[int]) -> str | None:
    if id(node) in seen:
        return None
    seen.add(id(node))
    if isinstance(node, yaml.ScalarNode):
        if len(node.value) > MAX_CHARS:
            return (f"{path}{_where(node)} is a string of {len(node.value):,} characters, more "
                    f"than the {MAX_CHARS:,} a setting's string may hold")
        return None
    items = node.value
    kind = "list" if isinstance(node, yaml.SequenceNode) else "mapping"
    if len(items) > MAX_ITEMS:
        return (f"{path}{_where(node)} is a {kind} of {len(items):,} entries, more than the "
                f"{MAX_ITEMS:,} a setting's {kind} may hold")
    children = items if kind == "list" else [n for pair in items for n in pair]
    for i, child in enumerate(children):
        found = _too_big(child, f"{path}[{i}]" if kind == "list" else path, seen)
        if found:
            return found
    return None


def bound_value(name: str, node: yaml.Node) -> None:
    """Refuse a setting's value too big to check at a bounded cost, naming the variable, the
    size and the limit."""
    problem = _too_big(node, name, set())
    if problem is None:
        total = _node_sizes(node)[1]
        if total > MAX_VALUES:
            problem = (f"{name}{_where(node)} holds {total:,} values, more than the "
                       f"{MAX_VALUES:,} one setting may hold")
    if problem:
        raise InputError(problem, fix=f"give {name} a value of a usable size: its lists and "
                         f"mappings at most {MAX_ITEMS:,} entries, its strings at most "
                         f"{MAX_CHARS:,} characters")


def check_document(document: yaml.Node, vars_file: bool) -> None:
    """Refuse tags Ansible cannot read and settings without bound in one YAML document."""
    try:
        _tags_refused(document, "", set())
        for name, value in variables(document, vars_file):
            bound_value(name, value)
    except RecursionError:
        raise InputError("values nested too deeply to read") from None


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
    folder = inventory.parent if inventory.is_file() else inventory
    for path in files:
        vars_file = any(part in _VARS_FOLDERS for part in path.relative_to(folder).parts)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InputError(f"inventory file {path}: cannot read it: {exc.strerror}") from None
        if _is_vault(data):
            continue
        try:
            for document in compose_bounded(_decode(data), str(path)):
                check_document(document, vars_file)
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


def _load_value(text: str, where: str, name: str | None = None) -> Any:
    """A -e value; `name`: the variable it sets (None: a mapping of variables)."""
    try:
        documents = compose_bounded(text, where)
        for document in documents:
            check_document(document if name is None else
                           yaml.MappingNode("tag:yaml.org,2002:map",
                                            [(yaml.ScalarNode("tag:yaml.org,2002:str", name),
                                              document)]), vars_file=True)
    except InputError as exc:
        fix = f". Fix: {exc.fix}" if exc.fix else ""
        raise InputError(f"{where}: {exc}{fix}") from None
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
            out[key] = _load_value(value, f"-e {key}", key) if value else ""
    secret = _secret_paths(out, "")
    if secret:
        raise InputError(
            f"-e {', '.join(secret)}: a secret on the command line ends up in the runner "
            f"artifacts and the shell history, and inside sglang_server_overrides it is not "
            f"even used as a secret. Fix: set sglang_server_api_key / sglang_server_hf_token "
            f"in the inventory (the router's API keys likewise), encrypted with ansible-vault")
    return out
