"""The one registry of secrets: which names and options hold secret values, derived from the
server's and the router's settings tables (a setting marked secret, the env file variable it
is stored under, the option it renders). The node-side copy that masking, evidence and process
listings use (plugins/module_utils/common/secrets.py, which a node can import without this
package) is generated from it:

    python -m sglang_fleet.settings.secrets --write   # rewrite the generated part of the node copy

and tests/unit/test_secrets.py fails when it drifts. Adding a secret setting to either table
is the whole change: run the generator.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from sglang_fleet.settings import router as router_settings
from sglang_fleet.settings import server as settings
from sglang_fleet.settings.kinds import SettingsTable

NODE_COPY = Path(__file__).resolve().parents[3] / "plugins" / "module_utils" / \
    "common/secrets.py"
_BEGIN = ("# ---- generated from the settings tables: "
          "python -m sglang_fleet.settings.secrets --write ----")
_END = "# ---- end of the generated part ----"


def _tables() -> tuple[SettingsTable, ...]:
    return settings.TABLE, router_settings.TABLE


def _secret_rows(tables: tuple[SettingsTable, ...] | None) -> list:
    return [s for table in tables or _tables() for s in table if s.secret]


def secret_names(tables: tuple[SettingsTable, ...] | None = None) -> list[str]:
    """Each secret setting's variable, its short name and its env file variable (one that
    ends in `*` is numbered per item: a prefix, secret_prefixes)."""
    names: set[str] = set()
    for s in _secret_rows(tables):
        names |= {s.variable, s.name}
        if s.env and not s.env.endswith("*"):
            names.add(s.env)
    return sorted(names)


def secret_flags(tables: tuple[SettingsTable, ...] | None = None) -> list[str]:
    return sorted({s.flag for s in _secret_rows(tables) if s.flag})


def secret_prefixes(tables: tuple[SettingsTable, ...] | None = None) -> list[str]:
    """Env file variables numbered per item (the router's control-plane keys)."""
    return sorted({s.env.removesuffix("*") for s in _secret_rows(tables)
                   if s.env and s.env.endswith("*")})


def _tuple_lines(values: list[str]) -> list[str]:
    body = ", ".join(f'"{v}"' for v in values) + ","
    return textwrap.wrap(body, 96, initial_indent="    ", subsequent_indent="    ",
                         break_on_hyphens=False, break_long_words=False)


def generated_block(tables: tuple[SettingsTable, ...] | None = None) -> str:
    lines = [_BEGIN,
             "# The toolkit's secret settings (server and router), their short names, the env "
             "file variables",
             "# they are stored under, and the command-line options whose values are secrets.",
             "SECRET_NAMES = frozenset((", *_tuple_lines(secret_names(tables)), "))",
             "SECRET_FLAGS = (", *_tuple_lines(secret_flags(tables)), ")",
             "SECRET_PREFIXES = (", *_tuple_lines(secret_prefixes(tables)), ")", _END]
    return "\n".join(lines)


def node_copy_text(tables: tuple[SettingsTable, ...] | None = None) -> str:
    """The node copy with its generated part from `tables` (the two roles' by default)."""
    text = NODE_COPY.read_text()
    head, _, rest = text.partition(_BEGIN)
    _, _, tail = rest.partition(_END)
    return head + generated_block(tables) + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_fleet.settings.secrets",
                                     description="Write the node copy of the secret registry.")
    parser.add_argument("--write", action="store_true", help="write it (else: check)")
    args = parser.parse_args(argv)
    text = node_copy_text()
    if args.write:
        NODE_COPY.write_text(text)
        print(f"wrote {NODE_COPY}")
        return 0
    if NODE_COPY.read_text() != text:
        print(f"out of date: {NODE_COPY} (run python -m sglang_fleet.settings.secrets --write)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
