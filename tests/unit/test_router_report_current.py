"""Whether the router report its check made still holds at the end of a deploy: a re-run that
changes nothing in front of the router shows it without asking the router again."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[2] / "plugins" / "filter" / "sglang_router.py"


@pytest.fixture(scope="module")
def report_current():
    spec = importlib.util.spec_from_file_location("sglang_router_filter", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()["sglang_fleet_router_report_current"]


GROUPS = {"sglang_servers": ["s1", "s2"], "sglang_routers": ["r1"]}
CHECKED = {"report": "r1: serving at ...", "workers": []}


def hostvars(**servers):
    out = {"r1": {"sglang_router__node": CHECKED}, "s1": {}, "s2": {}}
    out.update(servers)
    return out


def ready_unchanged():
    return {"sglang_server__changing": False, "sglang_server_verdict": {"verdict": "ready"},
            "sglang_router__membership": {"results": [], "skipped": True}}


def test_a_run_that_changed_nothing_keeps_the_checks_report(report_current):
    assert report_current("r1", GROUPS, hostvars(s1=ready_unchanged(), s2=ready_unchanged()))
    # Servers left out of the run (--limit) changed nothing either.
    assert report_current("r1", GROUPS, hostvars(s1=ready_unchanged()))


def test_no_report_from_the_check_means_the_report_asks(report_current):
    hv = hostvars(s1=ready_unchanged(), s2=ready_unchanged())
    hv["r1"] = {"sglang_router__node": {"workers": [], "action": "restarted"}}
    assert not report_current("r1", GROUPS, hv)
    hv["r1"] = {}
    assert not report_current("r1", GROUPS, hv)


@pytest.mark.parametrize("change", [
    {"sglang_server__changing": True},
    {"sglang_server_verdict": {"verdict": "stalled"}},
    {"sglang_router__membership": {"results": [
        {"item": {"name": "r1"}, "changed": True}]}},
])
def test_anything_in_front_of_the_router_that_changed_makes_the_report_ask(report_current,
                                                                           change):
    assert not report_current("r1", GROUPS, hostvars(s1=ready_unchanged(),
                                                     s2={**ready_unchanged(), **change}))


def test_a_membership_call_to_another_router_leaves_this_ones_report(report_current):
    other = {**ready_unchanged(), "sglang_router__membership": {"results": [
        {"item": {"name": "r2"}, "changed": True}, {"item": {"name": "r1"}, "skipped": True}]}}
    assert report_current("r1", GROUPS, hostvars(s1=ready_unchanged(), s2=other))
