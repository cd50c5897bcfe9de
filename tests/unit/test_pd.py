"""Prefill/decode disaggregation on the controller: a side's own settings, and what the servers
of one PD deployment must agree on, refused before any node is touched."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from sglang_fleet.launch.pd import (
    decodes_beside,
    deployment_errors,
    held_side,
    keep_sides_serving,
    named_by_decodes,
    prefill_wait,
    router_side_gap,
)
from sglang_fleet.launch.spec import build_launch_spec
from sglang_fleet.testfleet.local import role_defaults


def arg_value(argv: list, flag: str) -> str:
    """The value after `flag` in a rendered command line."""
    return argv[argv.index(flag) + 1]


def build(host: str = "n1", **values):
    settings = {**role_defaults(), "sglang_server_api_key": "sk-3f9a1c7e5b2d4068a1",
                **{f"sglang_server_{k}": v for k, v in values.items()}}
    return build_launch_spec(settings, host)


def prefill(host: str = "p1", **values):
    return build(host, pd_deployment="kimi_pd", disaggregation_mode="prefill", **values)


def decode(host: str = "d1", **values):
    return build(host, pd_deployment="kimi_pd", disaggregation_mode="decode", **values)


def test_a_prefill_renders_its_side_and_its_bootstrap_port():
    built = prefill(disaggregation_bootstrap_port=9100, disaggregation_ib_device="mlx5_0,mlx5_1")
    assert built["ok"], built["errors"]
    argv = built["spec"]["argv"]
    assert arg_value(argv, "--disaggregation-mode") == "prefill"
    assert arg_value(argv, "--disaggregation-bootstrap-port") == "9100"
    assert arg_value(argv, "--disaggregation-ib-device") == "mlx5_0,mlx5_1"
    pd = built["spec"]["pd"]
    assert (pd["deployment"], pd["mode"], pd["bootstrap_port"]) == ("kimi_pd", "prefill", 9100)
    assert pd["agree"]["transfer backend"] == "mooncake"


def test_a_server_without_a_side_has_no_pd_part_and_renders_as_before():
    built = build()
    assert built["ok"] and built["spec"]["pd"] is None
    assert not any(a.startswith("--disaggregation") for a in built["spec"]["argv"]
                   if isinstance(a, str))


def test_a_side_without_a_deployment_and_a_deployment_without_a_side_are_refused():
    lonely = build(disaggregation_mode="decode")
    assert "host n1: sglang_server_disaggregation_mode='decode': a prefill or decode server " \
           "serves only beside the other side" in lonely["errors"][0]
    assert "set sglang_server_pd_deployment" in lonely["errors"][0]
    sideless = build(pd_deployment="kimi_pd")
    assert "set sglang_server_disaggregation_mode to prefill or decode" in sideless["errors"][0]


def test_what_sglang_refuses_on_a_prefill_is_refused_here():
    fake = prefill(disaggregation_transfer_backend="fake")
    assert any("Prefill server does not support 'fake'" in e for e in fake["errors"])
    clash = prefill(port=8998)
    assert any("sglang_server_disaggregation_bootstrap_port=8998: the prefill's KV bootstrap "
               "server would listen on sglang_server_port's port 8998" in e
               for e in clash["errors"]), clash["errors"]
    # A decode's own HTTP port may be anything: the bootstrap server is the prefill's.
    assert decode(port=8998)["ok"]


def test_rdma_devices_are_read_as_sglang_reads_them():
    assert prefill(disaggregation_ib_device='{"0": "mlx5_0", "1": "mlx5_1"}')["ok"]
    assert prefill(disaggregation_ib_device="/etc/sglang/ib.json")["ok"]
    bad = prefill(disaggregation_ib_device="mlx5_0, mlx5 1")
    assert any("names no device as SGLang reads them (['mlx5 1'])" in e for e in bad["errors"])
    broken = prefill(disaggregation_ib_device='{"0": "mlx5_0",}')
    assert any("is not valid JSON" in e for e in broken["errors"])
    auto = prefill()
    assert any("mooncake will discover the RDMA devices itself" in w for w in auto["warnings"])


def test_pd_settings_on_a_server_without_a_side_are_said_to_do_nothing():
    built = build(disaggregation_bootstrap_port=9100)
    assert built["ok"]
    assert any("sglang_server_disaggregation_bootstrap_port has no effect" in w
               for w in built["warnings"])


def _deployment(**specs):
    modes = {h: s["spec"]["pd"]["mode"] for h, s in specs.items()}
    return deployment_errors("kimi_pd", "p1", sorted(specs), modes,
                             {h: s["spec"] for h, s in specs.items()}, {})


def test_a_deployment_whose_sides_agree_passes():
    assert _deployment(p1=prefill(), d1=decode("d1")) == []


def test_what_a_decode_holds_its_prefill_to_must_agree_across_the_deployment():
    errors = _deployment(p1=prefill(kv_cache_dtype="fp8_e4m3"),
                         d1=decode("d1", extra_args=["--page-size", "64"]))
    assert ("PD deployment kimi_pd: its servers disagree on --kv-cache-dtype (auto on d1; "
            "fp8_e4m3 on p1)") in "\n".join(errors)
    assert "disagree on --page-size (64 on d1; None on p1)" in "\n".join(errors)
    assert all("Fix: set it once, in group_vars/kimi_pd" in e for e in errors)


def test_different_attention_backends_need_one_page_size():
    errors = _deployment(p1=prefill(attention_backend="fa3"),
                         d1=decode("d1", attention_backend="triton"))
    assert any("different attention backends (fa3, triton) without --page-size" in e
               for e in errors), errors
    same_page = _deployment(p1=prefill(attention_backend="fa3", extra_args=["--page-size", "1"]),
                            d1=decode("d1", attention_backend="triton",
                                      extra_args=["--page-size", "1"]))
    assert same_page == []


def test_a_deployment_needs_both_sides_and_only_sides():
    errors = deployment_errors("kimi_pd", "p1", ["p1", "p2", "x"],
                               {"p1": "prefill", "p2": "prefill", "x": None}, {}, {})
    assert errors[0].startswith("PD deployment kimi_pd has no decode server (its hosts: p1, "
                                "p2, x)")
    assert "x is neither prefill nor decode" in errors[1]
    assert deployment_errors("kimi_pd", "q", ["p1"], {}, {}, {})[0].startswith(
        "host q: sglang_server_pd_deployment=kimi_pd: the host is not in inventory group")


SIDES = {"p1": "prefill", "d1": "decode"}


def test_a_pd_deployment_sits_behind_a_router_in_pd_mode_of_its_own():
    assert deployment_errors("kimi_pd", "p1", ["p1", "d1"], SIDES, {},
                             {"router-1": (True, ["p1", "d1"])}) == []
    plain = deployment_errors("kimi_pd", "p1", ["p1", "d1"], SIDES, {},
                              {"router-1": (False, ["p1", "d1"])})
    assert plain == ["host p1: router router-1 fronts PD deployment kimi_pd without PD mode "
                     "and would send whole requests to a prefill server. Fix: set "
                     "sglang_router_pd_disaggregation: true for router-1"]
    shared = deployment_errors("kimi_pd", "p1", ["p1", "d1"], SIDES, {},
                               {"router-1": (True, ["p1", "d1", "node-9"])})
    assert "router router-1 fronts PD deployment kimi_pd and also node-9, outside it" in \
        shared[0] and "sglang_router_workers_group (kimi_pd)" in shared[0]


def test_a_regular_server_is_refused_behind_a_router_in_pd_mode():
    assert deployment_errors("", "node-9", [], {}, {}, {"r": (False, ["node-9"])}) == []
    errors = deployment_errors("", "node-9", [], {}, {}, {"r": (True, ["node-9"])})
    assert errors[0].startswith("host node-9: router r runs in PD mode")


def _router_filters():
    path = Path(__file__).resolve().parents[2] / "plugins" / "filter" / "sglang_router.py"
    spec = importlib.util.spec_from_file_location("sglang_router_filters", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pd_host(mode: str, verdict: str | None, serves_http: bool = True) -> dict:
    out = {"sglang_server_launch_spec": {"pd": {"deployment": "dsv3", "mode": mode},
                                         "group": {"serves_http": serves_http}}}
    if verdict is not None:
        out["sglang_server_verdict"] = {"verdict": verdict}
    return out


def test_a_decode_stays_out_of_its_routers_only_while_every_judged_prefill_is_not_ready():
    assert prefill_wait("dsv3", {"p1": "failed", "p2": "ready"}) == ""
    # A prefill this run did not judge (a --limit, an earlier batch) may be serving.
    assert prefill_wait("dsv3", {"p1": "failed", "p2": None}) == ""
    assert prefill_wait("dsv3", {}) == ""
    reason = prefill_wait("dsv3", {"p2": "unhealthy", "p1": "failed"})
    assert reason.startswith("no prefill of PD deployment dsv3 is ready (p1 failed, "
                             "p2 unhealthy)")
    filters = _router_filters()
    groups = {"dsv3": ["p1", "p1b", "p2", "d1"]}
    hostvars = {"p1": _pd_host("prefill", "failed"), "p2": _pd_host("prefill", "unhealthy"),
                # A multi-node prefill's rank without HTTP is not asked.
                "p1b": _pd_host("prefill", "ready", serves_http=False),
                "d1": _pd_host("decode", "ready")}
    assert filters.pd_wait("d1", groups, hostvars) == reason
    assert filters.pd_wait("p1", groups, hostvars) == ""  # a prefill is never held back
    hostvars["p2"] = _pd_host("prefill", "ready")
    assert filters.pd_wait("d1", groups, hostvars) == ""


def test_a_decode_kept_out_says_why_whether_or_not_it_was_in():
    filters = _router_filters()
    removed = [{"item": {"name": "r1"}, "changed": True, "action": "removed"}]
    absent = [{"item": {"name": "r1"}, "changed": False, "action": "none"}]
    assert filters.membership_text(removed, "d1", "http://d1:30000", "no prefill ...") == (
        "d1: left router r1 (http://d1:30000); no prefill ...")
    assert filters.membership_text(absent, "d1", "http://d1:30000", "no prefill ...") == (
        "d1: stays out of router r1; no prefill ...")
    assert filters.membership_text(absent, "d1", "http://d1:30000") == ""
    removed[0]["before_text"] = "registered as decode, healthy, load 0"
    assert filters.view_text(removed, "d1", "ready", "no prefill ...") == (
        "d1: router r1: registered as decode, healthy, load 0 (gate: ready); removed it: "
        "no prefill ...")


def _members(**hosts):
    """deployment d's hosts: name -> (mode, unit, keep)."""
    return {h: {"deployment": "d", "mode": m, "unit": u or h, "keep": k}
            for h, (m, u, k) in hosts.items()}


def test_a_side_of_two_servers_in_the_run_is_held_by_the_first_host_of_each_server():
    members = _members(p1=("prefill", None, True), p2=("prefill", None, True),
                       d1=("decode", "dg1", True), d1b=("decode", "dg1", True),
                       d2=("decode", "dg2", True), d2b=("decode", "dg2", True))
    run = ["p1", "p2", "d1", "d1b", "d2", "d2b"]
    assert [held_side(h, members, run) for h in run] == [
        "sglang_fleet__pd_side__d__prefill", "sglang_fleet__pd_side__d__prefill",
        "sglang_fleet__pd_side__d__decode", "", "sglang_fleet__pd_side__d__decode", ""]
    # The cut falls before the second decode's first node: its nodes stay together.
    sides = [{"p1", "p2"}, {"d1", "d2"}]
    assert keep_sides_serving([run], sides) == [["p1"], ["p2", "d1", "d1b"], ["d2", "d2b"]]


def test_a_side_that_cannot_or_may_go_whole_is_not_held():
    one = _members(p1=("prefill", None, True), d1=("decode", None, True))
    assert held_side("p1", one, ["p1", "d1"]) == ""  # one server: nothing to keep serving
    two = _members(p1=("prefill", None, True), p2=("prefill", None, True),
                   d1=("decode", None, True))
    assert held_side("p1", two, ["p1", "d1"]) == ""  # p2 is outside the run: it serves
    let_go = _members(p1=("prefill", None, True), p2=("prefill", None, False))
    assert held_side("p1", let_go, ["p1", "p2"]) == ""  # the inventory says so
    assert held_side("x", {"x": {"mode": None}}, ["x"]) == ""


def test_a_recovery_of_a_prefill_holds_its_deployments_decodes():
    sides = {"p1": ("d", "prefill"), "p2": ("d", "prefill"), "d1": ("d", "decode"),
             "d2": ("d", "decode"), "x": (None, None), "q1": ("e", "prefill")}
    groups = {"d": ["p1", "p2", "d1", "d2"], "e": ["q1"]}
    assert decodes_beside(["p1"], sides, groups) == ["d1", "d2"]
    assert decodes_beside(["p1", "p2", "d2"], sides, groups) == ["d1"]
    assert decodes_beside(["d1", "x", "q1"], sides, groups) == []  # a decode recovers alone


def test_a_router_without_a_healthy_server_of_a_side_is_named_with_the_fix():
    prefill = {"url": "http://p", "worker_type": "prefill", "is_healthy": True}
    decode = {"url": "http://d", "worker_type": "decode", "is_healthy": True}
    assert router_side_gap("p1", "r", "d", [prefill, decode], []) == ""
    gap = router_side_gap("p1", "r", "d", [prefill, dict(decode, is_healthy=False)], ["d1"])
    assert gap == ("p1: recovered, but router r lists no healthy decode server of PD "
                   "deployment d: every request through it fails; d1 was outside this run. "
                   "Fix: recover the deployment as a unit: sglang-fleet recover --limit d")
    assert "lists no healthy prefill and no decode server" in router_side_gap("p1", "r", "d",
                                                                               [], [])


def test_a_prefill_its_decodes_name_in_failed_transfers_is_unhealthy():
    ready = {"verdict": "ready", "phase": "serving", "reason": "/health answered 200",
             "headline": "ready: /health answered 200", "evidence": {"health": 200}}
    kv = {"requests_failed": 2, "lookups_failed": 0, "prefills_lost": 1,
          "prefills": ["10.0.0.5:8998"], "last_message": "Decode transfer failed ..."}
    decodes = {"d1": dict(ready, kv_transfer=kv), "d2": ready, "d3": None}
    judged = named_by_decodes(ready, "10.0.0.5:8998", decodes)
    assert judged["verdict"] == "unhealthy" and judged["cause"] is None
    assert judged["headline"] == (
        "unhealthy while serving: /health and its KV bootstrap server answer, but its decodes' "
        "KV transfers from it fail (bootstrap 10.0.0.5:8998; d1: 2 requests aborted, 1 lost "
        "connection; the latest: Decode transfer failed ...)")
    assert judged["evidence"] == {"health": 200, "decodes_kv_transfer": {"d1": kv}}
    assert "the fleet takes it out of its routers" in judged["advice"]
    # Another prefill, or one already judged failed by its own checks, is left as it is.
    assert named_by_decodes(ready, "10.0.0.6:8998", decodes) is ready
    crashed = dict(ready, verdict="crashed")
    assert named_by_decodes(crashed, "10.0.0.5:8998", decodes) is crashed


def test_the_only_prefill_is_unhealthy_when_every_ready_decode_fails_transfers_naming_none():
    """A waiting timeout names only its request: the only prefill of a deployment is the one
    its decodes failed with when every ready decode failed; one decode alone is its own
    suspect when there are others."""
    ready = {"verdict": "ready", "phase": "serving", "reason": "/health answered 200"}
    timeout = {"requests_failed": 1, "lookups_failed": 0, "prefills_lost": 0, "prefills": [],
               "last_message": "Decode transfer failed ... timed out after 3.0s"}
    both = {"d1": dict(ready, kv_transfer=timeout), "d2": dict(ready, kv_transfer=timeout)}
    judged = named_by_decodes(ready, "10.0.0.5:8998", both, only_prefill=True)
    assert judged["verdict"] == "unhealthy"
    assert set(judged["evidence"]["decodes_kv_transfer"]) == {"d1", "d2"}
    one = {"d1": dict(ready, kv_transfer=timeout), "d2": ready}
    assert named_by_decodes(ready, "10.0.0.5:8998", one, only_prefill=True) is ready
    assert named_by_decodes(ready, "10.0.0.5:8998", both, only_prefill=False) is ready


def test_a_prefills_restart_seen_by_its_decodes_is_no_failure_of_it():
    """Decodes lose a prefill that restarts (a rolling change): lines that failed no request,
    or whose latest came before the prefill began serving again, do not judge it."""
    ready = {"verdict": "ready", "phase": "serving", "since": 1000.0}
    lost = {"requests_failed": 0, "lookups_failed": 0, "prefills_lost": 2, "last_at": 1500.0,
            "prefills": ["10.0.0.5:8998"], "last_message": "Lost connection ..."}
    decodes = {"d1": dict(ready, kv_transfer=lost)}
    assert named_by_decodes(ready, "10.0.0.5:8998", decodes, only_prefill=True) is ready
    before = dict(lost, requests_failed=3, last_at=900.0)
    decodes = {"d1": dict(ready, kv_transfer=before)}
    assert named_by_decodes(ready, "10.0.0.5:8998", decodes, only_prefill=True) is ready
    after = dict(before, last_at=1100.0)
    decodes = {"d1": dict(ready, kv_transfer=after)}
    assert named_by_decodes(ready, "10.0.0.5:8998", decodes)["verdict"] == "unhealthy"
