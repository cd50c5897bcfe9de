"""The gate's stack sampling settings: from the inventory through the LaunchSpec's gate view to
sglang_health's options, bad values refused on the controller, and sampling the operator turned
off said in the verdict."""

from __future__ import annotations

import pytest
from test_stack_signatures import hung_ranks, obs, replay

from sglang_fleet.launch.spec import build_launch_spec
from sglang_fleet.launch.views import gate_module_args
from sglang_fleet.node.health import stacks
from sglang_fleet.testfleet.local import role_defaults


def build(**overrides):
    settings = {**role_defaults(), **{"sglang_server_" + k: v for k, v in overrides.items()},
                "sglang_server_attention_backend": "triton"}
    return build_launch_spec(settings, "node1")


def errors(result):
    assert not result["ok"], "expected a refusal"
    return "\n".join(result["errors"])


def test_defaults_reach_the_health_module():
    result = build()
    assert result["ok"], result["errors"]
    args = gate_module_args(result["spec"])
    assert (args["stack_sampling"], args["py_spy"], args["stack_interval"],
            args["stack_window"]) == (True, "", 10.0, 30.0)


def test_inventory_values_reach_the_health_module():
    result = build(stack_sampling=False, py_spy="/opt/tools/py-spy", stack_interval=4,
                   stack_window="12")
    assert result["ok"], result["errors"]
    args = gate_module_args(result["spec"])
    assert (args["stack_sampling"], args["py_spy"], args["stack_interval"],
            args["stack_window"]) == (False, "/opt/tools/py-spy", 4.0, 12.0)


def test_a_launch_spec_recorded_before_the_settings_leaves_the_module_defaults():
    spec = build()["spec"]
    for key in ("stack_sampling", "py_spy", "stack_interval", "stack_window"):
        del spec["gate"][key]
    args = gate_module_args(spec)
    assert not {"stack_sampling", "py_spy", "stack_interval", "stack_window"} & set(args)


@pytest.mark.parametrize("name,value,needles", [
    ("stack_interval", -5, ("sglang_server_stack_interval", "-5",
                            "must be between 0 and 600, both excluded", "e.g. 10")),
    ("stack_interval", 0, ("sglang_server_stack_interval", "both excluded")),
    ("stack_window", -1, ("sglang_server_stack_window", "both excluded")),
    ("stack_window", "soon", ("sglang_server_stack_window", "must be a number")),
    ("stack_sampling", "maybe", ("sglang_server_stack_sampling", "must be a boolean")),
    ("py_spy", "bin/py-spy", ("sglang_server_py_spy", "'bin/py-spy'",
                              "must be an absolute path of py-spy on the node")),
])
def test_bad_values_are_refused_naming_the_variable_value_and_fix(name, value, needles):
    text = errors(build(**{name: value}))
    for needle in needles:
        assert needle in text, text


def test_a_window_too_short_for_three_samples_is_refused_with_both_fixes():
    text = errors(build(stack_interval=10, stack_window=20))
    assert ("sglang_server_stack_window=20.0: is shorter than 3 samples of each rank at "
            "sglang_server_stack_interval 10 s (30 s): the stacks cannot be judged frozen "
            "within it") in text, text
    assert ("set sglang_server_stack_window to 30 or more, or sglang_server_stack_interval "
            "to 6.6 or less") in text, text


def test_the_shortest_window_that_can_see_three_samples_is_taken():
    assert build(stack_interval=4, stack_window=12)["ok"]
    # Turned off, the window judges nothing: no reason to refuse it.
    assert build(stack_sampling=False, stack_interval=10, stack_window=5)["ok"]


def test_sampling_turned_off_is_said_once_and_in_the_stalled_verdicts_evidence():
    seq = [(t, obs(error=stacks.TURNED_OFF)) for t in range(0, 700, 10)]
    verdicts = replay(seq)
    said = [v["stack_sampling"] for v in verdicts if v.get("stack_sampling")]
    assert said == ["stack sampling is off: turned off (stack_sampling: false); hangs are "
                    "judged by the phases' windows alone"]
    assert verdicts[-1]["verdict"] == "stalled" and "window 600 s" in verdicts[-1]["reason"]
    assert verdicts[-1]["evidence"]["stack_sampling"] == said[0]


def test_sampling_turned_on_again_judges_by_the_stacks():
    # Off for the first minute, then on (a re-run with sampling on): the stacks decide again.
    seq = [(t, obs(error=stacks.TURNED_OFF) if t < 60 else obs(hung_ranks()))
           for t in range(0, 200, 10)]
    verdicts = replay(seq)
    stalled = [v for v in verdicts if v["verdict"] == "stalled"]
    assert stalled and stalled[0]["signature"] == "cuda_graph_capture"
