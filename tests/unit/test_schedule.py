"""How the suite is spread over xdist's workers: the tests of a file that share a fleet are one
unit, other tests are units of their own, and units go out longest first by the recorded
durations."""

from __future__ import annotations

import json

from sglang_fleet.testfleet import schedule

PD = "tests/integration/test_pd.py"
ROUTER = "tests/integration/test_router.py"


def test_only_tests_sharing_a_wider_fixture_are_held_together():
    assert schedule.shared_names([("fleet", "module"), ("tmp_path", "function"),
                                  ("venv", "session"), ("setup", "class")]) == {"fleet", "setup"}
    tests = [(f"{ROUTER}::test_a", frozenset({"fleet"})),
             (f"{ROUTER}::test_b", frozenset()),
             (f"{ROUTER}::test_c", frozenset({"fleet", "router"})),
             (f"{ROUTER}::test_d", frozenset({"router"})),
             (f"{PD}::test_e", frozenset({"fleet"})),
             (f"{PD}::test_roll", frozenset()),
             (f"{PD}::test_f", frozenset({"pair"}))]
    # A session fixture is per worker anyway: it keeps no test beside another.
    # test_a and test_d share no fixture, but test_c links them; another file's fixture of
    # the same name is another fixture.
    assert schedule.units_of(tests) == [
        f"{ROUTER}#fleet+router", f"{ROUTER}::test_b", f"{ROUTER}#fleet+router",
        f"{ROUTER}#fleet+router", f"{PD}#fleet", f"{PD}::test_roll", f"{PD}#pair"]


def test_units_go_out_longest_first_and_a_files_tests_stay_together_in_order():
    tests = [("tests/unit/test_x.py::test_fast", "tests/unit/test_x.py::test_fast"),
             (f"{ROUTER}::test_a", ROUTER), (f"{ROUTER}::test_b", ROUTER),
             (f"{PD}::test_roll", f"{PD}::test_roll"),
             (f"{PD}::test_new", f"{PD}::test_new")]
    durations = {"tests/unit/test_x.py::test_fast": 0.1, f"{ROUTER}::test_a": 100.0,
                 f"{ROUTER}::test_b": 50.0, f"{PD}::test_roll": 300.0,
                 "tests/integration/test_other.py::test_c": 20.0}
    order = [tests[i][0] for i in schedule.longest_first(tests, durations)]
    # test_new is not recorded: it counts as its folder's median (75 s).
    assert order == [f"{PD}::test_roll", f"{ROUTER}::test_a", f"{ROUTER}::test_b",
                     f"{PD}::test_new", "tests/unit/test_x.py::test_fast"]
    assert schedule.estimator({})("tests/unit/test_y.py::t") == schedule.FALLBACK["unit"]


def test_the_group_xdist_appends_is_not_part_of_the_recorded_id():
    assert schedule.base_nodeid(f"{ROUTER}::test_a@{ROUTER}") == f"{ROUTER}::test_a"
    assert schedule.base_nodeid(f"{ROUTER}::test_a[x@y]") == f"{ROUTER}::test_a[x@y]"
    assert schedule.base_nodeid(f"{ROUTER}::test_a[x@y]@{ROUTER}") == f"{ROUTER}::test_a[x@y]"


def test_a_record_keeps_what_a_partial_run_did_not_run_and_drops_removed_files(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_kept.py").write_text("")
    record = tmp_path / "durations.json"
    record.write_text(json.dumps({"tests/test_kept.py::test_old": 3.0,
                                  "tests/test_gone.py::test_x": 9.0}))
    schedule.write_durations(record, {"tests/test_kept.py::test_new": 1.234}, tmp_path)
    assert schedule.read_durations(record) == {"tests/test_kept.py::test_old": 3.0,
                                               "tests/test_kept.py::test_new": 1.23}
    assert schedule.read_durations(tmp_path / "missing.json") == {}
