"""The one registry of secrets: which names and options hold secret values, derived from the
server's and the router's settings tables (a setting marked secret, the env file variable it
is stored under, the option it renders). Two files carry a generated part of it:

- the node-side copy that masking, evidence and process listings use
  (plugins/module_utils/common/secrets.py, which a node can import without this package);
- docs/validation.md's table of secret settings.

    python -m sglang_fleet.settings --write   # rewrites them, and the roles' generated files

and tests/unit/test_secrets.py fails when either drifts. Adding a secret setting to either
table is the whole change: run the generator (tests/unit/test_setting_rows.py shows it).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sglang_fleet.settings import router as router_settings
from sglang_fleet.settings import server as settings
from sglang_fleet.settings.kinds import SettingsTable

REPO = Path(__file__).resolve().parents[3]
NODE_COPY = REPO / "plugins" / "module_utils" / "common" / "secrets.py"
DOC = REPO / "docs" / "validation.md"
COMMAND = "python -m sglang_fleet.settings --write"

Tables = tuple[SettingsTable, ...]


def _tables() -> Tables:
    return settings.TABLE, router_settings.TABLE


def _secret_rows(tables: Tables | None) -> list:
    return [s for table in tables or _tables() for s in table if s.secret]


def secret_names(tables: Tables | None = None) -> list[str]:
    """Each secret setting's variable, its short name and its env file variable (one that
    ends in `*` is numbered per item: a prefix, secret_prefixes)."""
    names: set[str] = set()
    for s in _secret_rows(tables):
        names |= {s.variable, s.name}
        if s.env and not s.env.endswith("*"):
            names.add(s.env)
    return sorted(names)


def secret_flags(tables: Tables | None = None) -> list[str]:
    return sorted({s.flag for s in _secret_rows(tables) if s.flag})


def secret_prefixes(tables: Tables | None = None) -> list[str]:
    """Env file variables numbered per item (the router's control-plane keys)."""
    return sorted({s.env.removesuffix("*") for s in _secret_rows(tables)
                   if s.env and s.env.endswith("*")})


def _tuple_lines(values: list[str]) -> list[str]:
    body = ", ".join(f'"{v}"' for v in values) + ","
    return textwrap.wrap(body, 96, initial_indent="    ", subsequent_indent="    ",
                         break_on_hyphens=False, break_long_words=False)


def node_block(tables: Tables | None = None) -> list[str]:
    return ["# The toolkit's secret settings (server and router), their short names, the env "
            "file variables",
            "# they are stored under, and the command-line options whose values are secrets.",
            "SECRET_NAMES = frozenset((", *_tuple_lines(secret_names(tables)), "))",
            "SECRET_FLAGS = (", *_tuple_lines(secret_flags(tables)), ")",
            "SECRET_PREFIXES = (", *_tuple_lines(secret_prefixes(tables)), ")"]


def doc_block(tables: Tables | None = None) -> list[str]:
    """docs/validation.md's table: every secret setting, the env file variable its value is
    kept under and the option it gives."""
    lines = ["| Secret setting | Kept in the 0600 env file as | Option |", "|---|---|---|"]
    for s in _secret_rows(tables):
        env = f"`{s.env}` (one per item)" if s.env.endswith("*") else f"`{s.env}`"
        lines.append(f"| `{s.variable}` | {env if s.env else '-'} | "
                     f"{f'`{s.flag}`' if s.flag else '- (the environment)'} |")
    return lines


@dataclass(frozen=True)
class Generated:
    """A file with a part generated from the tables, between two marker lines."""

    path: Path
    begin: str
    end: str
    block: Callable[[Tables | None], list[str]]

    def text(self, tables: Tables | None = None, path: Path | None = None) -> str:
        """The file at `path` (its own by default) with its generated part from `tables`."""
        current = (path or self.path).read_text()
        head, found, rest = current.partition(self.begin)
        if not found:
            raise ValueError(f"{path or self.path} lacks the line {self.begin!r}")
        _, _, tail = rest.partition(self.end)
        return head + "\n".join([self.begin, *self.block(tables), self.end]) + tail


GENERATED = (
    Generated(NODE_COPY, f"# ---- generated from the settings tables: {COMMAND} ----",
              "# ---- end of the generated part ----", node_block),
    Generated(DOC, f"<!-- generated from the settings tables: {COMMAND} -->",
              "<!-- end of the generated part -->", doc_block),
)


def node_copy_text(tables: Tables | None = None) -> str:
    """The node copy with its generated part from `tables` (the two roles' by default)."""
    return GENERATED[0].text(tables)


def sync(write: bool, tables: Tables | None = None, folder: Path | None = None) -> list[Path]:
    """The generated files that differ from the tables (written when `write`). `folder`: a
    copy of the repository to work on instead of this one (same relative paths)."""
    stale = []
    for part in GENERATED:
        path = folder / part.path.relative_to(REPO) if folder else part.path
        text = part.text(tables, path)
        if path.read_text() != text:
            stale.append(path)
            if write:
                path.write_text(text)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_fleet.settings.secrets",
                                     description="Write the generated parts of the secret "
                                     "registry's node copy and docs/validation.md.")
    parser.add_argument("--write", action="store_true", help="write them (else: check)")
    args = parser.parse_args(argv)
    stale = sync(args.write)
    for path in stale:
        print(f"wrote {path}" if args.write else f"out of date: {path} (run {COMMAND})",
              file=sys.stdout if args.write else sys.stderr)
    return 0 if args.write or not stale else 1


if __name__ == "__main__":
    sys.exit(main())
