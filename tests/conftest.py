import os
from pathlib import Path

import pytest

from sglang_fleet.runs.store import STATE_DIR_VAR

REPO = Path(__file__).resolve().parents[1]
# The operator's own stores: no test may write into them.
OPERATOR_STORES = (REPO / ".sglang-fleet", REPO / "evidence")


def _snapshot() -> dict[str, tuple[int, int]]:
    files = {}
    for store in OPERATOR_STORES:
        for path in store.rglob("*") if store.exists() else ():
            if path.is_file():
                stat = path.stat()
                files[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return files


def pytest_xdist_auto_num_workers(config) -> int:
    """One worker more than the CPUs this process may use (at most 8): a worker spends part of
    each integration test waiting on simulated servers and gate windows, so on 2 CPUs three
    workers keep them about 86% busy where two left a third idle (889 s against 1036 s)."""
    return min(len(os.sched_getaffinity(0)) + 1, 8)


@pytest.fixture(scope="session", autouse=True)
def isolated_controller_state(tmp_path_factory):
    """Every playbook and CLI run of the suite keeps its ledger, results, evidence and run
    folders in a temporary state folder; at the end the operator's stores are checked
    untouched (a failure here fails the run)."""
    before = _snapshot()
    previous = os.environ.get(STATE_DIR_VAR)
    os.environ[STATE_DIR_VAR] = str(tmp_path_factory.mktemp("controller-state"))
    yield
    if previous is None:
        os.environ.pop(STATE_DIR_VAR, None)
    else:
        os.environ[STATE_DIR_VAR] = previous
    after = _snapshot()
    assert after == before, ("the test run wrote into the repository's own stores: "
                             f"{sorted(set(after.items()) ^ set(before.items()))[:10]}")


@pytest.fixture
def one_node(tmp_path):
    """A one-node simulated fleet, its processes ended after the test by the membership stop
    the product uses (stop.yml has tests of its own; a playbook run per test would cost
    seconds of CPU)."""
    from sglang_fleet.testfleet.local import make_fleet
    fleet = make_fleet(tmp_path, hosts=1)
    yield fleet
    fleet.kill_leftovers()
