"""The real SGLang package is the reference: the shipped catalogues, the simulator's parser and
every inventory's command line are checked against each release's own parser.

The reference environment (`python -m sglang_fleet.known.refenv ensure <version>`, built by
.ci/run) is reused when present and built here when not (a few minutes, no GPU needed).
"""

from __future__ import annotations

import pytest

from sglang_fleet.known import refenv
from sglang_fleet.known.catalogue import catalogue, shipped_versions
from sglang_fleet.reference import fidelity

VERSIONS = shipped_versions()


@pytest.fixture(scope="module", params=VERSIONS)
def release(request):
    return request.param, refenv.ensure(request.param, quiet=True)


def test_every_release_the_toolkit_pins_has_a_catalogue():
    from sglang_fleet.known.reviewed import releases

    assert set(releases()) == set(VERSIONS)
    assert "0.5.23" in VERSIONS


def test_shipped_catalogue_is_what_the_real_package_reports(release):
    version, env = release
    real = env.probe("dump")
    shipped = fidelity.shipped_catalogue(version)
    assert real["sglang_version"] == version
    missing = {f for o in real["options"] for f in o["flags"]} - {
        f for o in shipped["options"] for f in o["flags"]}
    assert not missing, f"options the catalogue lacks: {sorted(missing)[:20]}"
    assert real == shipped, ("the catalogue differs from the package: regenerate with "
                             f"python -m sglang_fleet.known.refenv catalogue {version} --write")


def test_simulator_parser_agrees_with_the_real_parser_on_generated_lines(release):
    version, env = release
    cat = catalogue(version)
    lines = fidelity.sample_command_lines(cat, count=300, seed=7)
    real = env.probe("parse", lines)
    agreement = fidelity.compare(lines, real, fidelity.simulator_verdicts(cat, lines))
    assert agreement.lines >= 300
    # Both sides must refuse and accept in earnest, not agree by refusing everything.
    accepted = sum(r["ok"] for r in real)
    assert 0.3 * len(lines) < accepted < 0.9 * len(lines)
    assert agreement.disagreements == [], agreement.disagreements[:5]
    assert agreement.verdicts_agree == agreement.lines
    assert agreement.values_agree == agreement.accepted_by_both == accepted


@pytest.mark.parametrize("inventory", fidelity.INVENTORIES)
def test_every_rendered_command_line_parses_in_sglang(inventory):
    hosts = fidelity.rendered_server_args(inventory)
    assert hosts, f"{inventory} rendered no host"
    by_version: dict[str, list[tuple[str, list[str]]]] = {}
    for host, rendered in hosts.items():
        by_version.setdefault(rendered["version"], []).append((host, rendered["server_args"]))
    for version, items in by_version.items():
        env = refenv.ensure(version, quiet=True)
        # argparse: exactly what the release's parser accepts (works without a GPU for every
        # release); 0.5.23's prepare_server_args also runs its post-parse checks on a CPU.
        parsed = env.probe("parse", [argv for _, argv in items])
        refused = [(host, r["error"]) for (host, _), r in zip(items, parsed, strict=True)
                   if not r["ok"]]
        assert not refused, refused
        if version == "0.5.23":
            prepared = env.probe("prepare", [argv for _, argv in items])
            refused = [(host, r["error"]) for (host, _), r in zip(items, prepared, strict=True)
                       if not r["ok"]]
            assert not refused, refused
