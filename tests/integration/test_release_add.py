"""Any release, the day it ships: SGLang 0.5.22, which the toolkit does not ship, is added on the
controller from its own package (a wheelhouse of its real wheel) and deployed on the simulated
fleet with its own flags; a flag only 0.5.23 has is refused naming 0.5.22. Upgrades are
checked before they start, and bad input is said plainly and touches nothing.

Everything is built into a private cache (SGLANG_FLEET_REF_DIR) that shares the controller's
CPU torch environment and its built 0.5.23 and 0.5.4.post3 (.ci/run builds them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from sglang_fleet.cli.release import diff
from sglang_fleet.known import refenv, release_cache
from sglang_fleet.known.catalogue import catalogue
from sglang_fleet.testfleet.local import REPO, make_fleet, sglang_fleet
from sglang_fleet.testfleet.router import router_venv

pytestmark = pytest.mark.integration

NEW = "0.5.22"
ROUTER = "0.3.1"  # the shipped catalogue is 0.3.2's


def venv_state() -> list[tuple[str, float]]:
    """What the project's own .venv holds: every installed distribution, and when its
    site-packages last changed."""
    site = next((REPO / ".venv" / "lib").glob("python3*/site-packages"))
    return sorted((p.name, p.stat().st_mtime) for p in site.iterdir()) + [
        ("<site-packages>", site.stat().st_mtime)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    shared = release_cache.root()
    tmp = tmp_path_factory.mktemp("release-add")
    cache = tmp / "cache"
    cache.mkdir()
    for name in ("venv", "sglang-0.5.23", "sglang-0.5.4.post3"):
        assert (shared / name).exists(), f"{shared / name}: run .ci/run's refenv step first"
        (cache / name).symlink_to(shared / name)
    wheels = tmp / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d",
                    str(wheels), f"sglang=={NEW}"], check=True, timeout=600)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SGLANG_FLEET_REF_DIR", str(cache))
        yield cache, wheels
        # The release checks' warm probes of this cache end with it.
        refenv.stop_warm_probes()


@pytest.fixture(scope="module")
def added(cache):
    folder, wheels = cache
    before = venv_state()
    proc = sglang_fleet("release", "add", NEW, "--wheelhouse", str(wheels))
    return proc, before, venv_state()


def test_release_add_builds_it_from_the_wheelhouse_and_leaves_the_project_venv_alone(
        added, cache):
    proc, before, after = added
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"SGLang {NEW}: " in proc.stdout and "read from its own package" in proc.stdout
    dump = json.loads(release_cache.catalogue_file("sglang", NEW).read_text())
    assert dump["sglang_version"] == NEW and len(dump["options"]) > 300
    assert dump["environment"], "the environment variables it reads"
    assert (cache[0] / f"sglang-{NEW}" / ".ready").exists()
    assert before == after, "building a release touched the project's .venv"
    listing = sglang_fleet("release", "list")
    line = next(x for x in listing.stdout.splitlines() if x.startswith(NEW))
    assert "built from its package" in line and "ready" in line


@pytest.fixture(scope="module")
def fleet(added, tmp_path_factory):
    fleet = make_fleet(tmp_path_factory.mktemp("fleet-0.5.22"), hosts=1)
    group_vars = fleet.inventory / "group_vars" / "sglang_servers.yml"
    settings = yaml.safe_load(group_vars.read_text())
    settings["sglang_server_version"] = NEW
    group_vars.write_text(yaml.safe_dump(settings, sort_keys=False))
    yield fleet
    fleet.stop()
    fleet.kill_leftovers()


def test_the_added_release_deploys_on_the_simulated_fleet(fleet):
    run = fleet.deploy()
    assert run.rc == 0, run.output[-3000:]
    spec = json.loads((fleet.host_root(fleet.hosts[0]) / "run").glob(
        "*.running-spec.json").__next__().read_text())
    assert spec["sglang_version"] == NEW


def test_a_flag_only_the_newer_release_has_is_refused_naming_the_release(fleet):
    only_new = next(f for f in diff(catalogue(NEW), catalogue("0.5.23")).added
                    if not catalogue("0.5.23").by_flag[f].takes_values)
    proc = sglang_fleet("check", "-i", str(fleet.inventory), "-e", json.dumps(
        {**fleet.extra, "sglang_server_extra_args": [only_new]}))
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert f"{only_new} is not an option of SGLang {NEW}" in proc.stdout


def test_release_diff_of_the_real_packages_lists_renamed_and_removed_flags(cache):
    proc = sglang_fleet("release", "diff", "0.5.4.post3", "0.5.23", "--full")
    assert proc.returncode == 0, proc.stdout[-3000:]
    for line in ("--cuda-graph-max-bs -> --cuda-graph-max-bs-decode or "
                 "--cuda-graph-max-bs-prefill", "--nsa-decode-backend -> --dsa-decode-backend",
                 "    --enable-double-sparsity\n", "    --enable-piecewise-cuda-graph\n",
                 "--hicache-mem-layout: 'layer_first' -> 'page_first'"):
        assert line in proc.stdout, line


def test_an_inventory_valid_on_the_old_release_gets_one_line_per_value_the_new_refuses(
        cache, tmp_path):
    fleet = make_fleet(tmp_path, hosts=1)
    values = {"sglang_server_extra_args": ["--stream-output", "--enable-double-sparsity",
                                           "--nsa-decode-backend", "flashmla_sparse"]}
    old = sglang_fleet("check", "-i", str(fleet.inventory), "-e",
                       json.dumps({**fleet.extra, **values, "sglang_server_version":
                                   "0.5.4.post3"}))
    assert old.returncode == 0, old.stdout[-3000:]
    new = sglang_fleet("check", "-i", str(fleet.inventory), "-e",
                       json.dumps({**fleet.extra, **values, "sglang_server_version": "0.5.23"}))
    assert new.returncode == 2, new.stdout[-3000:]
    lines = [x for x in new.stdout.splitlines() if "sglang_server_extra_args" in x]
    assert len(lines) == 3, lines
    assert any("--stream-output was removed in SGLang 0.5.23" in x and "drop it" in x
               for x in lines)
    assert any("--enable-double-sparsity was removed" in x and "drop it" in x for x in lines)
    assert any("--nsa-decode-backend was removed" in x and "--dsa-decode-backend" in x
               for x in lines)
    assert not fleet.root.exists()


def test_an_unreachable_registry_says_what_to_pass_and_touches_nothing(cache):
    folder, _ = cache
    before = sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock"))
    env = dict(os.environ, PIP_INDEX_URL="http://127.0.0.1:9/simple")
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "sglang-fleet"), "release", "add",
                           "0.5.21"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 2
    assert "could not reach the package registry" in proc.stderr
    assert "pass --wheelhouse DIR" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock")) == before


def test_a_release_that_does_not_exist_names_the_nearest(cache):
    proc = sglang_fleet("release", "add", "0.5.199")
    assert proc.returncode == 2
    assert "sglang 0.5.199 is not a release in the package registry; the nearest are: " \
        in proc.stdout
    assert "0.5.23" in proc.stdout.split("the nearest are: ")[1]
    old = sglang_fleet("release", "add", "0.4.0")
    assert old.returncode == 2 and "releases before 0.5.4.post3" in old.stdout


@pytest.fixture(scope="module")
def router_added(cache):
    folder, _ = cache
    wheels = folder.parent / "router-wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d",
                    str(wheels), f"sglang-router=={ROUTER}"], check=True, timeout=600)
    before = venv_state()
    proc = sglang_fleet("release", "add", "--router", ROUTER, "--wheelhouse", str(wheels))
    return proc, before, venv_state()


def test_a_router_release_is_read_from_its_own_package_and_listed(router_added):
    proc, before, after = router_added
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"sglang-router {ROUTER}: " in proc.stdout and "read from its own package" in proc.stdout
    dump = json.loads(release_cache.catalogue_file("sglang-router", ROUTER).read_text())
    assert dump["router_version"] == ROUTER and len(dump["options"]) > 50
    assert before == after, "adding a router release touched the project's .venv"
    listing = sglang_fleet("release", "list").stdout
    routers = listing.split("sglang-router releases:")[1]
    assert any(x.startswith(ROUTER) and "built from its package" in x
               for x in routers.splitlines())


def test_a_router_option_only_the_newer_release_has_is_refused_naming_the_release(
        router_added, tmp_path, tmp_path_factory):
    fleet = make_fleet(tmp_path, hosts=1, router=router_venv(
        tmp_path_factory.getbasetemp().parent))
    changes = sglang_fleet("release", "diff", "--router", ROUTER, "0.3.2")
    assert changes.returncode == 0, changes.stdout[-3000:]
    assert f"sglang-router {ROUTER} -> 0.3.2" in changes.stdout
    only_new = "--disable-health-check"
    assert only_new in changes.stdout.split("added (")[1]
    pinned = {**fleet.extra, "sglang_router_version": ROUTER}
    ok = sglang_fleet("check", "-i", str(fleet.inventory), "-e", json.dumps(pinned))
    assert ok.returncode == 0, ok.stdout[-3000:]
    refused = sglang_fleet("check", "-i", str(fleet.inventory), "-e", json.dumps(
        {**pinned, "sglang_router_extra_args": [only_new]}))
    assert refused.returncode == 2, refused.stdout[-3000:]
    line = next(x for x in refused.stdout.splitlines() if "sglang_router_extra_args" in x)
    assert only_new in line and ROUTER in line, line
    assert not fleet.root.exists()


def test_a_router_release_that_cannot_be_read_is_said_plainly(cache):
    missing = sglang_fleet("release", "add", "--router", "0.3.99")
    assert missing.returncode == 2
    assert "sglang-router 0.3.99 is not a release in the package registry; the nearest are: " \
        in missing.stdout
    old = sglang_fleet("release", "add", "--router", "0.1.9")
    assert old.returncode == 2 and "releases before 0.2.0" in old.stdout
    assert "Traceback" not in missing.stdout + old.stdout
