"""The pure parts of asking a release: the nearest releases to a wrong name, which inventory
variables a refusal names, when an accepted verdict serves the same fleet on other ports, and
what a host's case says it could not check, and what a failed install says pip met."""

from __future__ import annotations

import pytest

from sglang_fleet.known import release_check
from sglang_fleet.known.refenv import (
    explain_install_failure,
    nearest_releases,
    release_name_problem,
)

OFFERED = ["0.5.4.post3", "0.5.5", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]


def test_the_nearest_releases_sit_around_the_wrong_name():
    assert nearest_releases("0.5.99", OFFERED) == ["0.5.21", "0.5.22", "0.5.23"]
    assert nearest_releases("0.5.10", OFFERED) == ["0.5.5", "0.5.20", "0.5.21"]
    assert release_name_problem("0.4.0").startswith("SGLang 0.4.0 is not supported")
    assert "not a release number" in release_name_problem("latest")
    assert release_name_problem("0.5.22") is None


def test_an_accepted_verdict_serves_the_same_lines_on_other_ports():
    shifted = release_check._port_shifted(
        {"argv": ["--port", "31234", "--grpc-port", "31236", "--dist-init-addr",
                  "10.0.0.1:31300"]})
    assert shifted["argv"] == ["--port", "30000", "--grpc-port", "30002", "--dist-init-addr",
                               "10.0.0.1:30066"]
    assert release_check._port_shifted({"argv": ["--grpc-port", "70000"]}) is None
    assert release_check._port_shifted({"argv": ["--tp-size", "8"]}) is None


def refusal(message: str, statement: str = "") -> dict:
    return {"ok": False, "error": [message],
            "raised_at": {"file": "sglang/srt/arg_groups/validation_hook.py", "line": 1,
                          "code": "raise ValueError(", "statement": statement}}


CASE = {"version": "0.5.23", "model_config": {}, "unchecked": [],
        "sources": {"tp_size": ["sglang_server_tp", "8"],
                    "ep_size": ["sglang_server_ep", "3"],
                    "page_size": ["sglang_server_extra_args", "['--page-size', '3']"]}}
FLAGS = {"--page-size": "page_size", "--tp-size": "tp_size", "--ep-size": "ep_size"}


def test_a_refusal_names_the_variables_behind_the_arguments_it_reads():
    named = release_check.refused_by(CASE, refusal(
        "ValueError: parallel topology is inconsistent: tp_size == moe_ep_size * ..."), FLAGS)
    assert named == [("sglang_server_tp", "8"), ("sglang_server_ep", "3")]
    by_statement = release_check.refused_by(CASE, refusal(
        "AssertionError", "assert cfg.chunked_prefill_size % cfg.page_size == 0"), FLAGS)
    assert by_statement == [("sglang_server_extra_args", "['--page-size', '3']")]
    unnamed = release_check.refused_by(CASE, refusal("ValueError: something else"), FLAGS)
    assert unnamed == [("sglang_server_extra_args", "['--page-size', '3']")]


def test_a_module_the_cpu_environment_lacks_is_not_a_refusal():
    errors, notes = release_check.problems("n1", CASE, refusal(
        "ModuleNotFoundError: No module named 'sgl_kernel'"), FLAGS)
    assert errors == [] and "cannot load" in notes[0]


def test_what_the_controller_lacks_is_named():
    case = release_check.case_of("0.5.23", ["--model-path", "/models/in-house"],
                                 release_check.model_config("/models/in-house"), {}, None,
                                 None)
    assert case["argv"] == ["--model-path", release_check.MODEL_TOKEN]
    assert len(case["unchecked"]) == 3
    assert "set sglang_server_model_config" in case["unchecked"][0]
    assert release_check.probe_case(case)["parse_only"]


def test_an_environment_variable_the_release_does_not_read_is_named_with_the_nearest():
    from sglang_fleet.launch.spec import build_launch_spec
    from sglang_fleet.testfleet.local import role_defaults

    settings = {**role_defaults(), "sglang_server_attention_backend": "triton",
                "sglang_server_extra_env": {"SGLANG_ENABLE_JIT_DEEPGEM": 0,
                                            "SGLANG_ENABLE_JIT_DEEPGEMM": 0}}
    built = build_launch_spec(settings, "n1")
    assert built["ok"], built["errors"]
    assert built["warnings"] == ["host n1: sglang_server_extra_env: SGLang 0.5.23 reads no "
                                 "SGLANG_ENABLE_JIT_DEEPGEM; did you mean "
                                 "SGLANG_ENABLE_JIT_DEEPGEMM?"]


# pip's stderr in the shapes it prints (written here, not copied from a run).
_REFUSED = ("WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, "
            "status=None)) after connection broken by 'NewConnectionError('<pip._vendor.urllib3."
            "connection.HTTPConnection object>: Failed to establish a new connection: [Errno 111] "
            "Connection refused')': /simple/sglang/\n"
            "ERROR: Could not find a version that satisfies the requirement sglang==0.5.21 "
            "(from versions: none)\nERROR: No matching distribution found for sglang==0.5.21")
_MIRROR_WITHOUT_IT = ("ERROR: Could not find a version that satisfies the requirement "
                      "sglang==0.5.21 (from versions: none)\n"
                      "ERROR: No matching distribution found for sglang==0.5.21")
_CONFLICT = ("ERROR: Cannot install sglang==0.5.21 because these package versions have "
             "conflicting dependencies.\nERROR: ResolutionImpossible: for help visit "
             "https://pip.pypa.io/en/latest/topics/dependency-resolution/")


@pytest.mark.parametrize(("error", "says", "never"), [
    (_REFUSED, "could not reach the package registry to fetch sglang==0.5.21", "lists no"),
    (_MIRROR_WITHOUT_IT, "the package registry pip uses lists no release of sglang==0.5.21",
     "could not reach"),
    (_CONFLICT, "pip could not install sglang==0.5.21 (pip: ERROR: ResolutionImpossible",
     "could not reach"),
])
def test_a_failed_install_says_what_pip_met(error, says, never):
    text = str(explain_install_failure("0.5.21", error, None))
    assert says in text and never not in text, text
    if error is _CONFLICT:
        assert "conflicting dependencies" in text  # the lines that say why are kept
