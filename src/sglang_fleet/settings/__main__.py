"""Every file generated from the settings tables, in one command:

    python -m sglang_fleet.settings --write   # the two roles' defaults and argument specs,
                                              # the node copy of the secrets, docs' table
    python -m sglang_fleet.settings           # check only: exit 1 naming what is stale

Adding a row to either table, a secret one included, is the row and this command."""

from __future__ import annotations

import argparse
import sys

from sglang_fleet.settings import router, secrets, server

COMMAND = "python -m sglang_fleet.settings --write"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sglang_fleet.settings",
        description="Write (or check) every file generated from the settings tables.")
    parser.add_argument("--write", action="store_true", help="write them (else: check)")
    flag = ["--write"] if parser.parse_args(argv).write else []
    failed = 0
    for part in (server.ROLE_FILES.main, router.ROLE_FILES.main, secrets.main):
        failed |= part(flag)
    return failed


if __name__ == "__main__":
    sys.exit(main())
