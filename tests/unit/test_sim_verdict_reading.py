"""The simulator's reading of the release's verdict: the controller's judge records, for each
simulated server, which cached verdict belongs to its configuration hash; the simulated server
reads it and refuses with SGLang's own line and frame, accepts what the release accepted, and
says once in its log when there is no verdict, then runs its own copies of the checks.

A private cache holds hand-made verdicts: nothing here runs a release."""

from __future__ import annotations

import pytest

from sglang_fleet.known import release_cache, release_check
from sglang_fleet.sim.args import server_args
from sglang_fleet.sim.engine.failures import SGLangError

VERSION = "0.5.23"
CONFIG = "0123456789ab"
ARGV = ["--model-path", "/models/Kimi-K2.5", "--tp-size", "8", "--base-gpu-id", "-1"]
REFUSED = {"ok": False, "error": ["ValueError: schedule_conservativeness must be non-negative"],
           "raised_at": {"file": "sglang/srt/arg_groups/validation_hook.py", "line": 321,
                         "function": "check_server_args",
                         "code": "raise ValueError(",
                         "statement": "if cfg.schedule_conservativeness < 0: raise ValueError("}}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_FLEET_REF_DIR", str(tmp_path))
    monkeypatch.setattr(server_args, "VERSION", VERSION)
    return tmp_path


def case(config_hash: str | None = CONFIG) -> dict:
    built = release_check.case_of(VERSION, ARGV, release_check.model_config("Kimi-K2.5"), {},
                                  96 << 30, "12.0")
    return {**built, "sim_config": config_hash} if config_hash else built


def seed(verdict: dict, config_hash: str | None = CONFIG) -> None:
    """A cached verdict for the case, and the judge's record of it for the configuration."""
    asked = case(config_hash)
    key = release_check._key(VERSION, release_check.probe_case(asked))
    release_cache.write_json(release_cache.root() / "verdicts" / VERSION / f"{key}.json",
                             verdict)
    assert release_check.judge({"sim-node-1": asked}) == {"sim-node-1": verdict}


def start(monkeypatch, config_hash: str | None = CONFIG) -> server_args.SimServerArgs:
    if config_hash:
        monkeypatch.setenv("SGLANG_FLEET_CONFIG", config_hash)
    else:
        monkeypatch.delenv("SGLANG_FLEET_CONFIG", raising=False)
    args = server_args.prepare_server_args(ARGV)
    args.resolve_once()
    args.check_server_args()
    return args


def test_judge_records_the_verdict_of_a_simulated_servers_configuration(cache):
    seed(REFUSED)
    verdict, missing = release_check.config_verdict(VERSION, CONFIG)
    assert missing == "" and verdict == {**REFUSED, "parse_only": False}
    assert not (cache / "verdicts" / VERSION / "configs" / "other.json").exists()
    seed(REFUSED, None)  # a real server's case names no configuration: nothing recorded
    assert [p.name for p in (cache / "verdicts" / VERSION / "configs").iterdir()] == [
        f"{CONFIG}.json"]


def test_the_releases_refusal_is_raised_with_its_own_line_and_frame(cache, monkeypatch):
    seed(REFUSED)
    with pytest.raises(SGLangError) as raised:
        start(monkeypatch)
    assert isinstance(raised.value, ValueError)
    text = raised.value.traceback_text()
    assert text.endswith("\nValueError: schedule_conservativeness must be non-negative\n")
    assert '/sglang/srt/arg_groups/validation_hook.py", line 321, in check_server_args\n' \
           "    raise ValueError(\n" in text


def test_what_the_release_accepted_is_accepted_over_the_simulators_own_checks(
        cache, monkeypatch, capsys):
    # The simulator's copy of 0.5.23's base_gpu_id check refuses this line: the release's
    # verdict is what counts (here a hand-made acceptance).
    seed({"ok": True, "error": None})
    start(monkeypatch)
    assert "No verdict" not in capsys.readouterr().out


@pytest.mark.parametrize("situation", ["no configuration", "not judged", "verdict deleted",
                                       "parser only", "needs a GPU build"])
def test_without_a_verdict_the_simulator_says_so_once_and_runs_its_own_checks(
        cache, monkeypatch, capsys, situation):
    config: str | None = CONFIG
    if situation == "no configuration":
        config = None
    elif situation == "verdict deleted":
        seed({"ok": True, "error": None})
        for path in (cache / "verdicts" / VERSION).glob("*.json"):
            path.unlink()
    elif situation == "parser only":
        seed({"ok": True, "error": None})
        record = cache / "verdicts" / VERSION / "configs" / f"{CONFIG}.json"
        release_cache.write_json(record, {**release_cache.json.loads(record.read_text()),
                                          "parse_only": True})
    elif situation == "needs a GPU build":
        seed({"ok": False, "error": ["ModuleNotFoundError: No module named 'sgl_kernel'"],
              "raised_at": None})
    with pytest.raises(AssertionError, match="base_gpu_id must be non-negative"):
        start(monkeypatch, config)
    said = [x for x in capsys.readouterr().out.splitlines() if "No verdict of SGLang" in x]
    assert len(said) == 1, said
    assert said[0].endswith("The simulator runs its own copies of 17 of them instead.")
    reason = {"no configuration": "no configuration hash (SGLANG_FLEET_CONFIG)",
              "not judged": f"no verdict of SGLang {VERSION} on configuration {CONFIG}",
              "verdict deleted": "is missing from",
              "parser only": "ran only its parser on the controller",
              "needs a GPU build": "could not run on the controller (ModuleNotFoundError"}
    assert reason[situation] in said[0]


def test_a_release_without_copies_says_nothing_stands_in_for_its_checks(cache, monkeypatch,
                                                                        capsys):
    monkeypatch.setattr(server_args, "VERSION", "0.5.4.post3")
    monkeypatch.delenv("SGLANG_FLEET_CONFIG", raising=False)
    assert server_args.release_verdict() is None
    assert capsys.readouterr().out.rstrip().endswith(
        "The simulator has no copy of SGLang 0.5.4.post3's checks after its parser.")
