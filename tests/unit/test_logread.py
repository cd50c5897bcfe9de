"""Bounded log reading: the run's first and last bytes with a stated gap, from where the run
began; line numbers say what they count from."""

from __future__ import annotations

from sglang_fleet.node.health.observe import read_log
from sglang_fleet.node.logs import logread
from sglang_fleet.node.logs.logphase import RUN_SEPARATOR, parse_log

HEAD = ("[2026-01-01 00:00:00] server_args=ServerArgs(tp_size=2)\n"
        "[2026-01-01 00:00:10 TP0] Load weight begin. avail mem=70.00 GB\n")
FILLER = "[2026-01-01 00:01:00 TP0] Prefill batch, #new-seq: 1, #new-token: 4, #running-req: 0\n"
TAIL = ("[2026-01-01 09:00:00 TP1] Scheduler hit an exception: Traceback (most recent call "
        "last):\n  File \"scheduler.py\", line 1, in run_scheduler_process\n"
        "RuntimeError: NCCL error: unhandled system error\n")


def test_a_long_log_is_read_as_its_head_and_tail_with_the_gap_stated(tmp_path):
    path = tmp_path / "server.log"
    with path.open("w") as f:
        f.write(HEAD)
        f.write(FILLER * (24 * 1024 * 1024 // len(FILLER)))
        f.write(TAIL)
    read = logread.read_bounded(str(path))
    assert len(read.text) < logread.HEAD_BYTES + logread.TAIL_BYTES + 200
    assert read.skipped > 14 << 20 and read.note.startswith("read the first 1 MiB and the last "
                                                            "8 MiB; ")
    parsed = parse_log(read.text)
    assert [r["phase"] for r in parsed["timeline"]][:2] == ["launching", "loading_weights"]
    cause = parsed["cause"]
    assert cause["said"].startswith("TP1: RuntimeError: NCCL error: unhandled system error "
                                    "(line ")
    assert cause["said"].endswith(" of the part read after the gap)")


def test_the_gate_reads_from_where_the_run_began(tmp_path):
    path = tmp_path / "server.log"
    old = "[2025-01-01 00:00:00 TP0] Scheduler hit an exception: Traceback\nKilled\n" * 1000
    path.write_text(old + f"\n{RUN_SEPARATOR}n1:m config abc at now =====\n" + HEAD + TAIL)
    text, _, lines_from = read_log(str(path), start=len(old))
    parsed = parse_log(text, lines_from=lines_from)
    assert [f["kind"] for f in parsed["failures"]] == ["nccl_error"]
    assert parsed["cause"]["said"].endswith("(line 7 of this run)")
