import os
from pathlib import Path

import pytest
from _pytest.nodeid import coerce_node_id

from sglang_fleet.runs.store import STATE_DIR_VAR
from sglang_fleet.testfleet import cpu_record, schedule

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


DURATIONS = REPO / "tests" / "durations.json"


def pytest_addoption(parser) -> None:
    parser.addoption("--record-durations", action="store_true",
                     help=f"write each test's seconds in this run into {DURATIONS.name} "
                          "(read to hand out the longest tests first)")
    parser.addoption("--cpu-by-file", type=int, metavar="N", default=0,
                     help="print the N files and N tests that took the most CPU seconds (the "
                          "test and the programs it waited for: ansible-playbook, module runs, "
                          "the CLI)")


def _shared_fixtures(item) -> frozenset[str]:
    return schedule.shared_names((name, fd.scope)
                                 for name, defs in item._fixtureinfo.name2fixturedefs.items()
                                 for fd in defs)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Units go out longest first (sglang_fleet.testfleet.schedule): the tests of a file that
    share a fleet are one unit of work on one worker (an xdist_group, marked before xdist's
    own hook reads the groups), and every other test is a unit of its own."""
    ids = [schedule.base_nodeid(item.nodeid) for item in items]
    units = schedule.units_of([(nodeid, _shared_fixtures(item))
                               for nodeid, item in zip(ids, items, strict=True)])
    tests = list(zip(ids, units, strict=True))
    order = schedule.longest_first(tests, schedule.read_durations(DURATIONS))
    for item, (nodeid, unit) in zip(items, tests, strict=True):
        if unit != nodeid:
            item.add_marker(pytest.mark.xdist_group(unit))
    items[:] = [items[i] for i in order]
    # An xdist worker: name each test's group in its id.
    if getattr(config.option, "loadgroup", False):
        for item, (nodeid, unit) in zip(items, [tests[i] for i in order], strict=True):
            if unit != nodeid and "@" not in item.nodeid:
                # xdist 3.8 appends `@group` to `item._nodeid`, which pytest 9 no longer
                # reads (its ids are `item._id`); the scheduler groups by that suffix.
                item._id = coerce_node_id(f"{item.nodeid}@{unit}")


class DurationRecorder:
    """Each test's setup, call and teardown seconds, as the controller receives them (from
    every worker), written at the end of the run."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report) -> None:
        nodeid = schedule.base_nodeid(report.nodeid)
        self.seconds[nodeid] = self.seconds.get(nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        schedule.write_durations(DURATIONS, self.seconds, REPO)


_CPU_AT_SETUP = pytest.StashKey[float]()


class CpuMeter:
    """`--cpu-by-file`, where tests run (each xdist worker, or the one process): each test's
    CPU from its setup to its teardown, carried to the controller in the teardown's report
    (sglang_fleet.testfleet.cpu_record)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        # Before the setup runs: a fixture's deploy (a module's shared fleet) is the first
        # test's, as its teardown is the last test's.
        item.stash[_CPU_AT_SETUP] = cpu_record.cpu_now()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        if call.when == "teardown" and _CPU_AT_SETUP in item.stash:
            spent = cpu_record.cpu_now() - item.stash[_CPU_AT_SETUP]
            outcome.get_result().user_properties.append((cpu_record.PROPERTY, spent))


class CpuTable:
    """`--cpu-by-file N`: the files and tests that took the most CPU, after the run."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report) -> None:
        for name, value in report.user_properties:
            if name == cpu_record.PROPERTY:
                self.seconds[schedule.base_nodeid(report.nodeid)] = value

    def pytest_terminal_summary(self, terminalreporter) -> None:
        terminalreporter.section("CPU by file")
        for line in cpu_record.table(self.seconds, self.top):
            terminalreporter.write_line(line)


def pytest_configure(config) -> None:
    if config.getoption("--cpu-by-file"):
        config.pluginmanager.register(CpuMeter(), "sglang-fleet-cpu-meter")
    if hasattr(config, "workerinput"):
        return
    if config.getoption("--record-durations"):
        config.pluginmanager.register(DurationRecorder(), "sglang-fleet-durations")
    if config.getoption("--cpu-by-file"):
        config.pluginmanager.register(CpuTable(config.getoption("--cpu-by-file")),
                                      "sglang-fleet-cpu")


def pytest_sessionfinish(session) -> None:
    """The release check's warm probes that the run's playbooks started end with the run (in
    the process that ran the session, after every worker): no test leaves a process behind."""
    if hasattr(session.config, "workerinput"):
        return
    from sglang_fleet.known import refenv

    refenv.stop_warm_probes()


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
