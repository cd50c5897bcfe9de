"""Fidelity to real SGLang: the figures of docs/sglang-reference.md's table, measured against
the real package.

    .venv/bin/python bench/fidelity.py [--lines 400] [--seed 1]

For each shipped release: options in the catalogue against the release's own parser; the
simulator's parser against SGLang's on generated command lines (accept/refuse, and every parsed
value where both accept); then every shipped inventory's rendered command line through the
pinned release's parser (argparse, and prepare_server_args for 0.5.23). Builds the reference
environments first when they are missing (python -m sglang_fleet.reference.refenv ensure).
"""

from __future__ import annotations

import argparse

from sglang_fleet.known.catalogue import catalogue, shipped_versions
from sglang_fleet.reference import fidelity, refenv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=400,
                        help="generated command lines beyond one per option")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    print("release      options: catalogue  real parser  equal | generated lines  accepted "
          "verdicts agree  values agree")
    for version in shipped_versions():
        env = refenv.ensure(version, quiet=True)
        real_dump = env.probe("dump")
        shipped = fidelity.shipped_catalogue(version)
        cat = catalogue(version)
        lines = fidelity.sample_command_lines(cat, args.lines, args.seed)
        real = env.probe("parse", lines)
        agree = fidelity.compare(lines, real, fidelity.simulator_verdicts(cat, lines))
        accepted = sum(r["ok"] for r in real)
        print(f"{version:<12} {len(shipped['options']):>18}  {len(real_dump['options']):>11}  "
              f"{'yes' if shipped == real_dump else 'NO':>5} | {agree.lines:>15}  "
              f"{accepted:>8}  {agree.verdicts_agree:>6} ({100 * agree.verdict_rate:.1f}%)  "
              f"{agree.values_agree:>6}/{agree.accepted_by_both}")

    print()
    print("inventory                              hosts  parsed by SGLang's parser")
    for inventory in fidelity.INVENTORIES:
        hosts = fidelity.rendered_server_args(inventory)
        ok = 0
        for host, rendered in sorted(hosts.items()):
            env = refenv.ensure(rendered["version"], quiet=True)
            probe = "prepare" if rendered["version"] == "0.5.23" else "parse"
            verdict = env.probe(probe, [rendered["server_args"]])[0]
            ok += verdict["ok"]
            if not verdict["ok"]:
                print(f"  {host}: refused: {verdict['error']}")
        print(f"{inventory:<38} {len(hosts):>5}  {ok}/{len(hosts)}")


if __name__ == "__main__":
    main()
