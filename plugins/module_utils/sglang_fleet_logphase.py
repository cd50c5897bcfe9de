# -*- coding: utf-8 -*-
# Reads an SGLang server log (0.5.23 and 0.5.4-0.5.12 formats) and says which start-up phase
# the server is in, how far along, and which failure lines it printed. Pure function of text.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import time

RUN_SEPARATOR = "===== sglang-fleet: start "

# (phase entered, pattern); checked in order of the start-up sequence.
_PHASE_MARKS = (
    ("loading_weights", re.compile(r"Load weight begin")),
    ("allocating_kv_cache", re.compile(r"Load weight end")),
    ("capturing_cuda_graph", re.compile(r"(?i)capture .*(cuda|cpu) graph begin")),
    ("starting_http", re.compile(r"(?i)capture .*(cuda|cpu) graph end|max_total_num_tokens=")),
    ("warming_up", re.compile(r"Uvicorn running on|Application startup complete")),
    ("serving", re.compile(r"The server is fired up and ready to roll!")),
)
_SHARDS = re.compile(r"Loading safetensors checkpoint shards:\s+(\d+)% Completed \| (\d+)/(\d+)")
_CAPTURE = re.compile(r"Capturing batches \([^)]*\):\s+(\d+)%\|[^|]*\| (\d+)/(\d+)")
_ACCESS = re.compile(r"\] INFO:\s+\S+ - \"")
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[^\]]*\]")
_FAILURES = (
    ("warmup_failed", re.compile(r"Initialization failed\. warmup error")),
    ("scheduler_exception", re.compile(r"Scheduler hit an exception")),
    ("capture_failed", re.compile(r"(?i)Capture cuda graph failed")),
    ("child_failed", re.compile(r"Received sigquit from a child process")),
    ("health_check_failed", re.compile(r"Health check failed")),
    ("watchdog_timeout", re.compile(r"(Scheduler w|W)atchdog timeout")),
    ("cuda_oom", re.compile(r"(torch\.)?OutOfMemoryError: CUDA out of memory|CUDA out of memory")),
    ("bind_failed", re.compile(r"error while attempting to bind")),
    ("traceback", re.compile(r"^Traceback \(most recent call last\)|Traceback \(most recent")),
)


def current_run(text):
    """The part of the log written since the last supervisor start separator."""
    at = text.rfind(RUN_SEPARATOR)
    return text if at < 0 else text[at:]


def split_lines(text):
    # tqdm redraws with carriage returns (0.5.23): each redraw is its own line here.
    return [line for line in re.split(r"[\r\n]+", text) if line.strip()]


# With CUDA graphs disabled nothing is captured: the end of the memory pool ends that phase.
_POOL_END = re.compile(r"Memory pool end")


def parse_log(text, cuda_graph=True):
    """Phase, progress and failures of the current run of one server log."""
    lines = split_lines(current_run(text))
    phase = "launching"
    shards = capture = None
    failures = []
    meaningful = 0
    phase_ts = last_ts = None
    last_is_bar = False
    for line in lines:
        if line.startswith(RUN_SEPARATOR):
            continue
        access = bool(_ACCESS.search(line))
        stamp = _timestamp(line)
        if not access:
            meaningful += 1
            if stamp is not None:
                last_ts = stamp
            last_is_bar = stamp is None
        for name, pattern in _PHASE_MARKS:
            if pattern.search(line):
                phase = name
                phase_ts = stamp if stamp is not None else phase_ts
        if not cuda_graph and phase == "allocating_kv_cache" and _POOL_END.search(line):
            phase, phase_ts = "starting_http", stamp if stamp is not None else phase_ts
        m = _SHARDS.search(line)
        if m:
            shards = [int(m.group(2)), int(m.group(3))]
        m = _CAPTURE.search(line)
        if m:
            capture = [int(m.group(2)), int(m.group(3))]
        for name, pattern in _FAILURES:
            if pattern.search(line):
                failures.append({"kind": name, "line": line.strip()[:500]})
    # 0.5.4 prints "Capture cuda graph end" and then the scheduler line; both land in
    # starting_http. Once capture ended the capture bar is complete.
    error_lines = [line.strip()[:500] for line in lines
                   if re.search(r"Error|Exception|Traceback|failed|FAILED", line)
                   and not _ACCESS.search(line)][-10:]
    return {
        "phase": phase,
        "shards": shards,
        "capture": capture,
        "failures": failures,
        "meaningful_lines": meaningful,
        # Epoch seconds of the line that entered the phase and of the last timestamped line;
        # whether the last meaningful line is an untimestamped progress bar redraw.
        "phase_started_at": phase_ts,
        "last_line_at": last_ts,
        "last_line_is_bar": last_is_bar,
        "error_lines": error_lines,
        "last_lines": [line.strip()[:500] for line in lines[-15:]],
    }


def phase_timeline(text):
    """(phase, line) for every line of the current run that entered a phase, in order."""
    timeline = []
    for line in split_lines(current_run(text)):
        for name, pattern in _PHASE_MARKS:
            if pattern.search(line) and _timestamp(line) is not None:
                timeline.append((name, line.strip()[:300]))
    return timeline


def _timestamp(line):
    m = _STAMP.match(line)
    if not m:
        return None
    try:
        return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None


def progress_text(parsed):
    """Short human progress, e.g. 'loading_weights 27/61 shards'."""
    phase = parsed["phase"]
    if phase == "loading_weights" and parsed["shards"]:
        return "%s %d/%d shards" % (phase, parsed["shards"][0], parsed["shards"][1])
    if phase == "capturing_cuda_graph" and parsed["capture"]:
        return "%s %d/%d batches" % (phase, parsed["capture"][0], parsed["capture"][1])
    return phase
