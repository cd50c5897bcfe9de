"""`sglang-fleet diagnose`: every fixture log read right, in plain text and JSON; standard
input; exit codes; a clear error for a log that cannot be read."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sglang_fleet.cli import main as cli
from sglang_fleet.node.logs.logphase import FATAL_KINDS
from sglang_fleet.recovery.diagnose import diagnose, duration, render

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
TRUTH = yaml.safe_load((LOGS / "truth.yml").read_text())
SGLANG_FLEET = Path(sys.executable).parent / "sglang-fleet"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["diagnose", *argv])
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def progress_of(p: dict | None) -> str | None:
    return None if p is None else f"{p['done']}/{p['total']} {p['unit']}"


def expected_gate(truth: dict) -> str | None:
    """The gate's conclusion from a fixture's truth; None: still starting (progressing or
    stalled, by the time now)."""
    if "gate" in truth:
        return truth["gate"]
    if truth["fatal"]:
        return "crashed"
    return "ready" if truth["phase"] == "serving" else None


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_json_reads_every_fixture_as_its_truth(capsys, name):
    truth = TRUTH[name]
    code, out, _ = run_cli(capsys, "--json", str(LOGS / name))
    report = json.loads(out)
    assert code == (1 if truth["fatal"] else 0)
    assert report["phase"] == truth["phase"]
    assert progress_of(report["progress"]) == truth["progress"]
    assert [f["kind"] for f in report["failures"]] == truth["failures"]
    assert all(set(f) >= {"kind", "fatal", "line"} for f in report["failures"])
    assert report["fatal"] is truth["fatal"]
    assert report["timeline"][0]["phase"] == "launching"
    assert report["timeline"][-1]["phase"] == truth["phase"]
    assert report["runs"] == truth.get("runs", 1)
    assert report["gate"]["verdict"] == expected_gate(truth) or (
        expected_gate(truth) is None and report["gate"]["verdict"] in ("progressing", "stalled"))


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_plain_output_reads_every_fixture_as_its_truth(capsys, name):
    truth = TRUTH[name]
    code, out, _ = run_cli(capsys, str(LOGS / name))
    assert code == (1 if truth["fatal"] else 0)
    phase_line = next(line for line in out.splitlines() if line.startswith("  phase "))
    assert phase_line.split()[1] == truth["phase"]
    if truth["progress"]:
        assert phase_line.endswith(truth["progress"])
    gate = next(line for line in out.splitlines() if line.startswith("  gate ")).split()[1]
    assert gate[:-1] == expected_gate(truth) or (
        expected_gate(truth) is None and gate in ("progressing:", "stalled:"))
    if not truth["failures"]:
        assert "failures  none" in out
    marks = [line.split()[:2] for line in out.splitlines()
             if line.startswith(("  FATAL  ", "  warn   "))]
    assert [kind for _, kind in marks] == truth["failures"]
    assert all(mark == "warn" or kind in FATAL_KINDS for mark, kind in marks)


def test_plain_report_for_a_fatal_failure_says_what_and_why(capsys):
    code, out, _ = run_cli(capsys, str(LOGS / "dp2-scheduler-oom-alive.log"))
    assert code == 1
    lines = out.splitlines()
    assert lines[2] == "  phase     capturing_cuda_graph (decode)  4/36 batches"
    assert lines[3] == ("  gate      crashed: DP1 TP0: torch.OutOfMemoryError: CUDA out of "
                        "memory. Tried to allocate 2.00 GiB. GPU 4 has a total capacity of "
                        "79.19 GiB of which 1.02 GiB is free. (log line 12); cuda_oom in "
                        "capturing_cuda_graph: fatal, even while processes live")
    assert lines[4] == ("            Fix: lower --mem-fraction-static (graphs and activations "
                        "need the rest)")
    assert "failures  1, 1 fatal" in out
    assert "  cuda_oom  fatal: the scheduler does not catch" in out


def test_standard_input_is_read_like_a_file(capsys, monkeypatch):
    data = (LOGS / "docker-restart-two-launches.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out, _ = run_cli(capsys, "--json", "-")
    report = json.loads(out)
    assert code == 0 and report["source"] == "stdin"
    assert report["phase"] == "loading_weights" and report["runs"] == 2
    assert report["progress"] == {"done": 12, "total": 64, "unit": "shards"}


def test_a_docker_logs_capture_piped_into_the_installed_command():
    # What an engineer types: docker logs -t sglang 2>&1 | sglang-fleet diagnose -
    data = (LOGS / "docker-timestamps.log").read_bytes()
    proc = subprocess.run([str(SGLANG_FLEET), "diagnose", "-"], input=data,
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode()
    assert out.startswith("stdin: ")
    assert "  phase     capturing_cuda_graph (decode)  9/36 batches" in out


@pytest.mark.parametrize("make_path,what", [
    (lambda tmp: tmp / "no-such.log", "no such file"),
    (lambda tmp: tmp, "is a folder, not a log"),
])
def test_a_log_that_cannot_be_read_is_a_usage_error_naming_it(capsys, tmp_path, make_path,
                                                               what):
    path = make_path(tmp_path)
    code, out, err = run_cli(capsys, str(path))
    assert code == 2 and out == ""
    assert err.startswith(f"sglang-fleet diagnose: LOGFILE {path}: {what}. Fix: ")
    assert "- to read standard input" in err


def test_an_unreadable_file_is_a_usage_error(capsys, tmp_path):
    path = tmp_path / "server.log"
    path.write_text("x\n")
    path.chmod(0)
    try:
        with open(path):  # root reads anything: nothing to test then
            pytest.skip("running as root")
    except PermissionError:
        pass
    code, _, err = run_cli(capsys, str(path))
    assert code == 2 and "cannot be read (Permission denied)" in err


AT = time.mktime((2026, 11, 30, 9, 4, 30, 0, 0, -1))  # 21 s after the decode bar began


@pytest.mark.parametrize("now,verdict,reason", [
    (AT, "progressing", "capturing_cuda_graph, last log progress 21 s ago (window 600 s"),
    (AT + 700, "stalled", "no log progress for 12 min 01 s in capturing_cuda_graph"),
])
def test_the_gates_conclusion_from_the_log_alone(now, verdict, reason):
    text = (LOGS / "0523-prefill-then-decode.log").read_text()
    report = diagnose(text, mtime=None, now=now)
    assert report["gate"]["verdict"] == verdict
    assert report["gate"]["reason"].startswith(reason)


def test_a_phase_over_its_ceiling_is_stalled_even_with_recent_lines():
    text = (LOGS / "0523-multithread-load.log").read_text()
    begin = time.mktime((2026, 11, 30, 8, 0, 41, 0, 0, -1))
    # The bar was redrawn a minute ago (the file's mtime); loading began 1 h, then 2.1 h ago.
    report = diagnose(text, mtime=begin + 3600 - 60, now=begin + 3600)
    assert report["gate"]["verdict"] == "progressing"
    report = diagnose(text, mtime=begin + 7560 - 60, now=begin + 7560)
    assert report["gate"]["verdict"] == "stalled"
    assert report["gate"]["reason"] == ("loading_weights has lasted 2 h 06 min, over its "
                                        "ceiling of 7200 s for a 1000B model")


def test_timeline_durations_run_to_the_next_phase_and_to_the_last_activity():
    text = (LOGS / "sglang-0.5.23-startup.log").read_text()
    report = diagnose(text, now=time.mktime((2026, 11, 30, 1, 0, 0, 0, 0, -1)))
    assert [(r["phase"], r["seconds"]) for r in report["timeline"]] == [
        ("launching", 39.0), ("loading_weights", 432.0), ("allocating_kv_cache", 4.0),
        ("capturing_cuda_graph", 41.0), ("starting_http", 2.0), ("warming_up", 3.0),
        ("serving", 0.0)]
    out = render(report, "server.log", now=time.mktime((2026, 11, 30, 1, 0, 0, 0, 0, -1)))
    assert "  2026-11-30 00:28:40  loading_weights              7 min 12 s  61/61 shards" in out


@pytest.mark.parametrize("seconds,text", [(0.4, "0 s"), (59, "59 s"), (61, "1 min 01 s"),
                                          (3600, "1 h 00 min"), (90061, "1 d 01 h")])
def test_durations_read_at_a_glance(seconds, text):
    assert duration(seconds) == text


# ---- bounded, inert reading ----------------------------------------------------------------

def test_a_device_is_refused_with_a_clear_error(capsys):
    code, out, err = run_cli(capsys, "/dev/zero")
    assert code == 2 and out == ""
    assert err.startswith("sglang-fleet diagnose: LOGFILE /dev/zero: is a device, not a log.")


def _diagnose_stdin(chunk: bytes, times: int) -> tuple[int, str, float, int]:
    """Pipe `chunk` `times` times into the installed command: (exit code, stdout, seconds,
    peak resident memory in bytes of the command)."""
    started = time.monotonic()
    # Started by a small Python of its own that reports the command's peak: ru_maxrss
    # survives execve, so a command forked straight from this test process (an xdist worker
    # grown past 1 GB in a long run) would count the worker's pages as its own.
    proc = subprocess.Popen([sys.executable, "-c", _PEAK_OF, str(SGLANG_FLEET), "diagnose",
                             "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    out: list[bytes] = []
    reader = __import__("threading").Thread(target=lambda: out.append(proc.stdout.read()))
    reader.start()
    try:
        for _ in range(times):
            proc.stdin.write(chunk)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    _, status, _ = os.wait4(proc.pid, 0)
    reader.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    peak = int(proc.stderr.read().split()[-1])
    return proc.returncode, b"".join(out).decode(), time.monotonic() - started, peak


_PEAK_OF = ("import os, subprocess, sys\n"
            "p = subprocess.Popen(sys.argv[1:], stderr=subprocess.DEVNULL)\n"
            "_, status, usage = os.wait4(p.pid, 0)\n"
            "print(usage.ru_maxrss * 1024, file=sys.stderr)\n"
            "sys.exit(os.waitstatus_to_exitcode(status))\n")


def binary_chunk() -> bytes:
    random = bytes((i * 7919 + 13) % 256 for i in range(1 << 16))
    return (random + b"\x00" * 4096 + b"\x1b[2J\x1b]0;x\x07\n"
            + b"[2026-01-01 00:00:00 TP0] Load weight begin. avail mem=1.00 GB\n") * 15


def test_binary_through_a_pipe_is_read_within_its_bounds():
    """128 MiB of binary through a pipe: read once through, under 200 MB, the bounds said.
    (bench/diagnose_reading.py times 1 GiB.)"""
    chunk = binary_chunk()
    code, out, _, peak = _diagnose_stdin(chunk, (128 << 20) // len(chunk) + 1)
    assert code == 0, out
    assert peak < 200 << 20, peak >> 20
    assert "stdin: " in out and "not read" in out  # the bounds are stated
    assert not any(c in out for c in "\x00\x1b\x07")


def test_an_endless_stream_stops_at_its_stated_limit():
    from sglang_fleet.node.logs import logread

    class Zeros(io.RawIOBase):
        def readable(self):
            return True

        def readinto(self, b):
            b[:] = b"\x00" * len(b)
            return len(b)

    read = logread.read_stream(io.BufferedReader(Zeros()), head=1 << 20, tail=1 << 20,
                               limit=64 << 20)
    assert read.size == 64 << 20 and read.note.startswith("stopped reading after 64 MiB")
    assert len(read.text) < 3 << 20


def test_ages_come_from_the_logs_own_stamps_and_say_so(capsys):
    text = (LOGS / "sigterm-drain-stop.log").read_text()
    now = time.mktime((2027, 8, 1, 12, 0, 0, 0, 0, -1))  # long after a copied log's last line
    out = render(diagnose(text, mtime=now - 60, now=now), "copied.log", now=now)
    last = next(line for line in out.splitlines() if line.startswith("  last "))
    assert last.startswith("  last      2026-09-01 09:40:22 (the log's own stamp; 334 d")
    assert "timeline (durations between the log's own stamps)" in out
    killed = (LOGS / "keyerror-tp8-per-rank.log").read_text()  # ends in an undated Killed
    out = render(diagnose(killed, mtime=now - 60, now=now), "copied.log", now=now)
    assert "  2026-07-14 09:12:49  loading_weights  20 s so far" in out
    # An undated last line (a bar redraw) is dated by the file, which is named.
    bar = (LOGS / "bare-bar-tail.log").read_text()
    out = render(diagnose(bar, mtime=now - 60, now=now), "server.log", now=now)
    assert "(the file's modification time; its last line has no stamp; 1 min 00 s before" in out


def test_the_plain_report_names_the_cause_once_with_ranks_and_line(capsys):
    code, out, _ = run_cli(capsys, str(LOGS / "keyerror-tp8-per-rank.log"))
    assert code == 1
    assert out.count("KeyError: 'model.layers.0.mlp.experts.w2_qweight'") == 2  # gate, failures
    assert "Fix: SGLang killed its own" not in out  # the cause is the KeyError, not the Killed
    assert ("  FATAL  scheduler_exception  TP0-7: KeyError: 'model.layers.0.mlp.experts."
            "w2_qweight' (log line 14) (x8)") in out
    assert "failures  3 (10 lines, the same ones said once), 3 fatal" in out


def test_escape_sequences_in_a_log_reach_the_terminal_as_text(capsys):
    code, out, _ = run_cli(capsys, str(LOGS / "escape-sequences-in-lines.log"))
    assert code == 1 and "\x1b" not in out and "\x00" not in out and "\x07" not in out
    assert "\\x1b]0;title\\x07" in out
