"""SGLANG_SIM_REGRESS: its grammar, its deterministic shares, and the controller's refusal of a
bad sglang_server_sim_regress with the same parse (the simulator's exit is in
tests/integration/test_sim_regress.py)."""

from __future__ import annotations

import pytest

from sglang_fleet.known.sim_regress import (
    ABORT,
    ERROR,
    TAIL_EVERY,
    Regression,
    RegressionError,
    parse_regress,
    regression_from_env,
)
from sglang_fleet.launch.spec import build_launch_spec
from sglang_fleet.testfleet.local import role_defaults


def test_every_item_is_read_and_nothing_given_is_no_regression():
    assert parse_regress("") == Regression()
    assert parse_regress(" decode=0.8, ttft=1.3,itl=1.3,errors=0.05,aborts=0.05,"
                         "outputs=changed ") == Regression(
        decode=0.8, ttft=1.3, itl=1.3, errors=0.05, aborts=0.05, outputs_changed=True)
    assert parse_regress("outputs=same").token_offset == 0
    assert parse_regress("outputs=changed").token_offset == 1


@pytest.mark.parametrize("text, problem", [
    ("decod=0.8", "unknown item 'decod=0.8'"),
    ("decode", "unknown item 'decode'"),
    ("decode=fast", "decode='fast' is not a number"),
    ("decode=nan", "decode='nan' is not a finite number"),
    ("ttft=0", "ttft=0 must be a factor above 0"),
    ("errors=1.5", "errors=1.5 must be a share from 0 to 1"),
    ("aborts=-0.1", "aborts=-0.1 must be a share from 0 to 1"),
    ("outputs=different", "outputs='different' is not one of changed, same, near"),
    ("itl=1.3,itl=2", "itl is given twice"),
])
def test_a_bad_item_is_named_with_the_accepted_forms(text, problem):
    with pytest.raises(RegressionError) as bad:
        parse_regress(text)
    assert bad.value.problem == problem
    assert "decode=F" in bad.value.fix and "errors=P" in bad.value.fix
    with pytest.raises(ValueError) as env_bad:
        regression_from_env({"SGLANG_SIM_REGRESS": text})
    assert str(env_bad.value).startswith(f"SGLANG_SIM_REGRESS={text!r}: {problem}; use ")


def test_errors_and_aborts_strike_every_round_1_over_p_th_request_and_never_the_same():
    regress = parse_regress("errors=0.05,aborts=0.05")
    outcomes = [regress.outcome(n) for n in range(1, 201)]
    assert outcomes.count(ERROR) == 10 and outcomes.count(ABORT) == 10
    assert [n for n, o in enumerate(outcomes, 1) if o == ERROR][:2] == [20, 40]
    assert [n for n, o in enumerate(outcomes, 1) if o == ABORT][:2] == [10, 30]
    assert outcomes == [regress.outcome(n) for n in range(1, 201)]  # deterministic
    assert {Regression().outcome(n) for n in range(1, 100)} == {None}
    assert {parse_regress("errors=1").outcome(n) for n in range(1, 10)} == {ERROR}


def test_decode_scales_every_interval_and_itl_only_one_in_twenty():
    base, tok_s = Regression(), 50.0
    assert parse_regress("decode=0.8").token_time(40, tok_s) == pytest.approx(
        base.token_time(40, tok_s) / 0.8)
    itl = parse_regress("itl=1.5")
    intervals = [itl.token_time(i, tok_s) - itl.token_time(i - 1, tok_s) for i in range(1, 201)]
    slow = [i for i, gap in enumerate(intervals, 1) if gap > 1.01 / tok_s]
    assert slow == list(range(TAIL_EVERY, 201, TAIL_EVERY))  # 5%, by token index
    assert max(intervals) == pytest.approx(1.5 / tok_s)
    assert sum(intervals) / len(intervals) == pytest.approx(1.025 / tok_s)  # the mean barely


def test_the_controller_refuses_a_bad_value_naming_variable_value_and_fix():
    settings = dict(role_defaults(), sglang_server_attention_backend="triton",
                    sglang_server_sim_regress="decode=0.8,erors=0.05")
    result = build_launch_spec(settings, "node1")
    assert not result["ok"]
    text = "\n".join(result["errors"])
    assert "sglang_server_sim_regress" in text and "'decode=0.8,erors=0.05'" in text
    assert "unknown item 'erors=0.05'" in text and "errors=P" in text


def test_a_simulated_server_gets_the_variable_only_when_a_regression_is_set():
    settings = dict(role_defaults(), sglang_server_attention_backend="triton",
                    sglang_server_install_mode="simulator")
    plain = build_launch_spec(settings, "node1")
    assert plain["ok"], plain["errors"]
    assert "SGLANG_SIM_REGRESS" not in plain["spec"]["env"]
    slower = build_launch_spec(dict(settings, sglang_server_sim_regress="decode=0.8"), "node1")
    assert slower["spec"]["env"]["SGLANG_SIM_REGRESS"] == "decode=0.8"
    assert slower["spec"]["config_hash"] != plain["spec"]["config_hash"]
