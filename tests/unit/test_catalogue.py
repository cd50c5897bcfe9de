"""The flag catalogue: lookups, the strict argument check, SGLang's own types."""

from __future__ import annotations

import argparse

import pytest

from sglang_fleet.known.catalogue import CONVERTERS, ParseError, catalogue, shipped_versions

CAT = catalogue("0.5.23")


def problems(*argv):
    return [(p.problem, p.fix) for p in CAT.check_args(list(argv)).problems]


def test_both_shipped_releases_are_complete():
    assert shipped_versions() == ("0.5.4.post3", "0.5.23")
    assert len(CAT.options) == 531 and len(catalogue("0.5.4.post3").options) == 272


def test_aliases_resolve_to_one_destination():
    assert CAT.by_flag["--tensor-parallel-size"].dest == CAT.by_flag["--tp-size"].dest
    assert CAT.by_flag["--ep"].dest == "ep_size"
    check = CAT.check_args(["--tensor-parallel-size", "4"])
    assert check.problems == [] and check.dests == {"tp_size": "--tensor-parallel-size"}


def test_abbreviations_are_refused_with_the_full_name():
    assert problems("--tp", "8") == [("--tp is an abbreviation of --tp-size",
                                      "write the full flag name --tp-size")]
    (problem, _), = problems("--cuda-graph-max", "8")
    assert "ambiguous" in problem and "--cuda-graph-max-bs-decode" in problem
    # SGLang's own parser does take the prefix: the check is stricter on purpose.
    assert CAT.parse(["--model-path", "m", "--tp", "8"]).tp_size == 8


def test_unknown_flags_get_did_you_mean():
    (problem, fix), = problems("--atention-backend", "triton")
    assert problem == "--atention-backend is not an option of SGLang 0.5.23"
    assert fix.startswith("did you mean --attention-backend")


def test_removed_flags_name_their_successors():
    assert problems("--cuda-graph-max-bs", "8") == [(
        "--cuda-graph-max-bs was removed in SGLang 0.5.23",
        "use --cuda-graph-max-bs-decode or --cuda-graph-max-bs-prefill")]


def test_choices_and_types_come_from_the_release():
    (problem, fix), = problems("--kv-cache-dtype", "fp9")
    assert "not a choice of --kv-cache-dtype in SGLang 0.5.23" in problem
    assert "fp8_e4m3" in fix
    assert problems("--kv-cache-dtype", "fp8_e4m3") == []
    (problem, fix), = problems("--port", "http")
    assert "not a valid value for --port" in problem and fix == "give --port an integer"
    assert problems("--quantization", "fp8") == []
    assert problems("--quantization", "fp9")


def test_suffixed_integers_parse_as_sglang_does():
    assert problems("--context-length", "32k") == []
    assert CAT.parse(["--model-path", "m", "--context-length", "32k"]).context_length == 32000
    assert CAT.parse(["--model-path", "m", "--context-length", "1Ki"]).context_length == 1024
    (problem, _), = problems("--context-length", "1.5Ki")
    assert "Decimals are not allowed with IEC suffixes" in problem


@pytest.mark.parametrize("argv,needle", [
    (["--port"], "--port expects a value"),
    (["--enable-metrics=1"], "--enable-metrics takes no value"),
    (["stray"], "'stray' is a value with no flag before it"),
    (["--port", "1", "--port=2"], None),  # the same flag twice: argparse keeps the last
    (["--tp-size", "2", "--tensor-parallel-size", "4"], "set the same option (tp_size)"),
])
def test_value_counts_and_repeats(argv, needle):
    found = " ".join(p for p, _ in problems(*argv))
    assert (needle in found) if needle else found == ""


def test_deprecated_flags_warn():
    check = CAT.check_args(["--disable-cuda-graph"])
    assert check.problems == []
    assert check.warnings == ["--disable-cuda-graph is deprecated in SGLang 0.5.23; use "
                              "--cuda-graph-backend-{decode,prefill}=disabled"]


def test_parse_raises_with_argparse_message():
    with pytest.raises(ParseError, match="invalid choice"):
        CAT.parse(["--model-path", "m", "--attention-backend", "nope"])


def test_json_list_type_refuses_what_orjson_refuses():
    convert = CONVERTERS["json_list_type"]
    assert convert("[1, 2]") == [1, 2]
    for bad in ("NaN", "[Infinity]", "[18446744073709551616]", "[1,"):
        with pytest.raises(argparse.ArgumentTypeError):
            convert(bad)
