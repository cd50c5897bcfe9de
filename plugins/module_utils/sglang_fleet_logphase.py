# -*- coding: utf-8 -*-
# Reads an SGLang server log and says which start-up phase the server is in, how far along the
# current sub-step is, and which failure lines it printed, and which of those end the server.
#
# The grammar below is written from SGLang's own format strings (0.5.23 and 0.5.4.post3:
# model_runner.py, cuda_graph_setup.py, *cuda_graph_runner.py, piecewise capture,
# model_loader/weight_utils.py, scheduler.py, tokenizer_manager.py, http_server.py, engine.py,
# utils/watchdog.py) and from the shapes logs take once other tools wrap them (docker, docker
# compose, Python logging wrappers). Pure function of text; Python 3.8 syntax (ships to nodes).
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import calendar
import re
import time
from collections import deque

try:
    from ansible.module_utils import sglang_fleet_vocab as vocab
except ImportError:  # imported by the controller package or its tests, outside Ansible
    from sglang_fleet_node import sglang_fleet_vocab as vocab

RUN_SEPARATOR = "===== sglang-fleet: start "

_PHASE_INDEX = dict((name, i) for i, name in enumerate(vocab.PHASES))
LINE_LIMIT = 500  # characters of a line kept in failures and evidence

# ---- the grammar ------------------------------------------------------------------------------

# Lines that enter a phase: (phase, event, pattern on the message after its prefix).
# "enter" moves forward only (a lagging rank's line never moves the phase back); "capture"
# lines may re-enter capture after a capture end, because SGLang captures in sub-steps
# (0.5.23: prefill then decode; 0.5.5-0.5.12: decode then piecewise; speculative: draft).
PHASE_LINES = (
    ("loading_weights", "enter", r"^Load weight begin\b"),
    ("allocating_kv_cache", "enter", r"^Load weight end\b"),
    ("allocating_kv_cache", "enter", r"^KV Cache is allocated\b"),
    ("capturing_cuda_graph", "capture", r"^Capture (?:.* )?(?i:cuda|cpu) graph begin\b"),
    ("capturing_cuda_graph", "capture", r"^Capture cuda graph (?:bs|num tokens) \["),
    ("capturing_cuda_graph", "capture", r"^Capturing \d+ prefill CUDA graph token shapes"),
    ("starting_http", "capture_end", r"^Capture (?:.* )?(?i:cuda|cpu) graph end\b"),
    ("starting_http", "enter", r"^max_total_num_tokens="),
    ("starting_http", "enter", r"^INFO:\s+(?:Started server process|Waiting for application "
                               r"startup)"),
    ("warming_up", "enter", r"Uvicorn running on|^INFO:\s+Application startup complete"),
    # The scheduler's batch lines (0.5.23 "Prefill batch, #new-seq: ..."; older "Prefill
    # batch. #new-seq: ..."; LOG_FORWARD_ITERS adds " [N]"): a request ran, warm-up at least.
    ("warming_up", "enter", r"^(?:Prefill|Decode) batch(?: \[\d+\])?[.,] "),
    ("warming_up", "enter", r"^(?:Start of pd disaggregation warmup|End of disaggregation "
                            r"warmup)"),
    ("serving", "enter", r"^The server is fired up and ready to roll!"),
)

# tqdm bars: (description, phase the bar belongs to, unit). SGLang's loaders draw
# "{desc}: {pct}% Completed | n/total [...]" (utils BAR_FORMAT); the capture loops draw tqdm's
# default "{desc}: {pct}%|{bar}| n/total [...]" and set the description after the first draw,
# so a capture's first draw is a bare bar.
BARS = (
    (r"^Multi-thread loading (?:pt checkpoint )?shards$", "loading_weights", "shards"),
    (r"^Loading (?:safetensors|pt|np_cache) checkpoint shards$", "loading_weights", "shards"),
    (r"^Loading safetensors using Fastsafetensor loader$", "loading_weights", "file groups"),
    (r"^Loading safetensors using ", "loading_weights", "tensors"),
    (r"^Capturing batches \(", "capturing_cuda_graph", "batches"),
    (r"^Capturing prefill shape \(", "capturing_cuda_graph", "prefill shapes"),
    (r"^Compiling num tokens \(", "capturing_cuda_graph", "shapes compiled"),
    (r"^Capturing num tokens \(", "capturing_cuda_graph", "piecewise shapes"),
    (r"^Fetching \d+ files$", "launching", "files"),
)

# Traceback frames that name a phase: the stack says where the server was even when the log
# level hid the phase's own lines. (pattern on the frame's path and function, phase)
FRAMES = (
    (r"[/\\](?:kv_cache_configurator|pool_configurator|memory_pool)\.py\"|"
     r" in (?:init_memory_pool|alloc_memory_pool|profile_max_num_token)$", "allocating_kv_cache"),
    (r"cuda_graph_runner\.py\"|cuda_graph_setup\.py\"|"
     r" in (?:capture_one_batch_size|capture_one_shape|init_device_graphs|init_cuda_graphs|"
     r"init_piecewise_cuda_graphs)$", "capturing_cuda_graph"),
    (r"[/\\]model_loader[/\\]| in (?:load_model|load_weights_and_postprocess)$",
     "loading_weights"),
)

# Failure lines, most specific first; a line takes the first kind that matches. `fatal` says
# whether SGLang's own code ends the server after printing it (verified in its source; see the
# README's gate section). This table is the one definition of failure kinds and fatality.
FAILURES = (
    # (kind, fatal, phase the line shows the server reached or None, pattern, why it is or
    # is not fatal)
    ("scheduler_exception", True, None, r"\bScheduler hit an exception",
     "run_scheduler_process logs it, then SIGQUITs its parent, which kills the process tree; "
     "with dp_size > 1 the main process can stay up with a dead scheduler"),
    ("subprocess_exception", True, None,
     r"\b(?:DataParallelController|TokenizerManager|DetokenizerManager) hit an exception",
     "the process ends and SIGQUITs its parent (the tokenizer kills the whole tree itself)"),
    ("warmup_failed", True, "warming_up", r"Initialization failed\. warmup error",
     "http_server kills its own process tree after a failed warm-up"),
    ("capture_failed", True, "capturing_cuda_graph", r"Capture (?i:cuda graph) failed",
     "raised out of the model runner's initialisation: the scheduler dies"),
    ("kv_pool_too_small", True, "allocating_kv_cache",
     r"Not enough memory\. Please try to increase --mem-fraction-static",
     "raised while sizing the KV pool: the scheduler dies before serving"),
    ("kv_alloc_oom", True, None,
     r"\b(?:Prefill|Decode) out of memory\. Try to lower your batch size",
     "logged, then raised as RuntimeError in the scheduler loop: the scheduler dies"),
    ("cuda_oom", True, None, r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory",
     "the scheduler does not catch torch.OutOfMemoryError (the few places that do print "
     "other text)"),
    ("memory_unbalanced", True, None, r"(?:Error|Exception): The memory capacity is unbalanced",
     "raised by default (SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK): the scheduler dies"),
    ("memory_unbalanced_warning", False, None, r"The memory capacity is unbalanced",
     "only logged when the balance check is turned off: start-up continues"),
    ("nccl_timeout", True, None, r"Watchdog caught collective operation timeout",
     "torch's NCCL watchdog aborts the process to avoid data inconsistency"),
    ("process_abort", True, None, r"terminate called after throwing an instance of",
     "C++ std::terminate: the process aborts without Python's cleanup"),
    ("nccl_error", True, None, r"\bNCCL error\b",
     "raised by a collective (pynccl or torch.distributed): the rank's scheduler dies"),
    ("watchdog_timeout", True, None, r"^(?:Scheduler )?[Ww]atchdog timeout \((?!.*soft=True)",
     "the scheduler's hard watchdog: a forward batch hung; it SIGQUITs the server"),
    ("soft_watchdog_timeout", False, None, r"\b[Ww]atchdog timeout \(.*soft=True",
     "the soft watchdogs (tokenizer, detokenizer, scheduler --soft-watchdog-timeout) only dump "
     "stacks"),
    ("child_failed", True, None,
     r"Received sigquit from a child process|SIGQUIT received\..*one child failed",
     "the main process's SIGQUIT handler kills the whole process tree"),
    ("subprocess_exited", True, None,
     r"Scheduler or DataParallelController \d+ terminated with|"
     r"Subprocess \S+ \(pid=\d+\) crashed with exit code",
     "a scheduler process has ended; the server cannot serve without it"),
    ("killed", True, None, r"^Killed$|\bline \d+: +\d+ Killed\b",
     "the shell reports a SIGKILLed server (the kernel's OOM killer, or a kill -9)"),
    ("fatal_signal", True, None,
     r"^Fatal Python error: (?:Segmentation fault|Aborted|Bus error)|"
     r"^(?:Segmentation fault|Aborted|Bus error)(?: \(core dumped\))?$|"
     r"\bline \d+: +\d+ (?:Segmentation fault|Aborted|Bus error)",
     "a process died of a signal"),
    ("bind_failed", True, "starting_http", r"error while attempting to bind on address",
     "uvicorn cannot listen on the port and the main process exits"),
    ("launch_exception", True, None, None,  # a traceback through the launcher's top-level frame
     "a traceback out of the launcher's top level: the main process exits"),
    ("health_check_failed", False, None, r"Health check failed",
     "/health answers 503 and marks the server unhealthy; nothing exits (the gate's own "
     "/health probe judges it)"),
    ("traceback", False, None, None,  # a traceback that named none of the kinds above
     "a traceback by itself is not fatal: request errors print one and the server goes on"),
)

FATAL_KINDS = frozenset(row[0] for row in FAILURES if row[1])
FAILURE_WHY = dict((row[0], row[4]) for row in FAILURES)

# What to try, for the kinds where SGLang's own message or source says it.
FAILURE_HINTS = {
    "capture_failed": "lower --mem-fraction-static or --cuda-graph-max-bs-decode, or disable "
                      "decode CUDA graphs (SGLang's own advice)",
    "kv_pool_too_small": "raise --mem-fraction-static, or free GPU memory",
    "kv_alloc_oom": "lower --max-running-requests or --chunked-prefill-size",
    "cuda_oom": "lower --mem-fraction-static (graphs and activations need the rest)",
    "memory_unbalanced": "another process holds memory on some of the GPUs",
    "nccl_timeout": "a rank hung or the interconnect failed: the rank that failed first is "
                    "the lead",
    "nccl_error": "check the NCCL_* settings, the interconnect and every rank's first error",
    "killed": "check the kernel log for the OOM killer (host memory)",
    "bind_failed": "another process listens on the port",
    "watchdog_timeout": "a forward batch hung for --watchdog-timeout seconds",
}

# ---- line shapes ------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Prefixes other tools add before SGLang's own line, outermost first.
_DOCKER_TS = re.compile(r"^(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d) ")
_COMPOSE = re.compile(r"^[A-Za-z0-9][\w.-]*[-_]\d+ *\| ?")
_RAY = re.compile(r"^\((?:[\w.]+ )?pid=\d+(?:, ip=[\d.:a-fA-F]+)?\) ")
_PY_LOGGING = re.compile(r"^(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d),\d{3} - (?:[\w.]+ - )?"
                         r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) - ")
# SGLang: "[%(asctime)s{.ms}{ DP0 PP0 ATTN_CP0 MOE_DP0 TP0 EP0}] " (utils configure_logger);
# some wrappers keep only the time; old releases printed "[gpu_id=N] ".
_STAMP = re.compile(r"^\[(?:(\d{4}-\d\d-\d\d) )?(\d\d:\d\d:\d\d)(?:[.,]\d+)?"
                    r"(?: [A-Z][A-Z_]*\d+)*\] ?")
_GPU_ID = re.compile(r"^\[gpu_id=\d+\] ?")
# Where one physical line holds two log lines: a bar without its newline followed by the next
# line, or two bar redraws without their carriage return.
_GLUED = re.compile(r"(?<=\])(?=\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:[.,]\d+)?"
                    r"(?: [A-Z][A-Z_]*\d+)*\] |\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - )"
                    r"|(?<=it/s\]|s/it\])(?=\S)")
_BAR = re.compile(r"^\s*(?:(?P<desc>\S.*?):\s*)?(?P<pct>\d{1,3})%"
                  r"(?:\s*Completed\s*\||\|[^|]*\|)\s*(?P<done>\d+)/(?P<total>\d+)")
# Python's traceback frames, and faulthandler's (no comma before "in") after a fatal signal.
_FRAME = re.compile(r'^\s*File "[^"]+", line \d+,? in \S+')
_TRACEBACK_HEADER = re.compile(r"(?:^|: )Traceback \(most recent call last\)")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(?:[A-Z]\w*)?(?:Error|Exception|Exit|Interrupt)\b")
_ACCESS = re.compile(r'^INFO:\s+\S+ - "')
_RUN_START = re.compile(r"^server_args=")
_LAUNCH_FRAME = re.compile(r'launch_server\.py", line \d+,? in <module>$|'
                           r'[/\\]sglang[/\\]cli[/\\]main\.py", line \d+,? in main$')
_ERRORISH = re.compile(r"Error|Exception|Traceback|failed|FAILED|Killed|terminate called")

_PHASE_LINES = [(phase, event, re.compile(p)) for phase, event, p in PHASE_LINES]
# One search per line first: most lines of a long log match none of the patterns.
_ANY_PHASE_LINE = re.compile("|".join("(?:%s)" % p for _, _, p in PHASE_LINES))
_BARS = [(re.compile(p), phase, unit) for p, phase, unit in BARS]
_FRAMES = [(re.compile(p), phase) for p, phase in FRAMES]
_FAILURES = [(kind, fatal, phase, re.compile(p)) for kind, fatal, phase, p, _ in FAILURES if p]
_ANY_FAILURE = re.compile("|".join("(?:%s)" % row[3] for row in FAILURES if row[3]))
_POOL_END = re.compile(r"^Memory pool end\b")
_CAPTURE_STEP = re.compile(r"(?i)^Capture (.*?) ?(?:cuda|cpu) graph")


class LogLine:
    """One logical line: its text as written, and the message under the prefixes."""

    __slots__ = ("raw", "message", "at")

    def __init__(self, raw, message, at):
        self.raw = raw
        self.message = message
        self.at = at  # epoch seconds of its own (or its wrapper's) stamp, else None


class _Clock:
    """Turns stamps into epoch seconds: full dates as local time (SGLang's asctime), docker's
    RFC 3339 as UTC, time-only stamps on the date of the last full date seen, else on the
    reference time's date, rolling over midnight."""

    def __init__(self, reference):
        self.reference = reference
        self.date = None
        self.last = None
        self._cache = {}

    def _epoch(self, date, clock):
        key = date + " " + clock
        if key not in self._cache:
            try:
                self._cache[key] = time.mktime(time.strptime(key, "%Y-%m-%d %H:%M:%S"))
            except (ValueError, OverflowError):
                self._cache[key] = None
        return self._cache[key]

    def local(self, date, clock):
        self.date = date
        return self._note(self._epoch(date, clock))

    def utc(self, date, clock):
        try:
            at = calendar.timegm(time.strptime(date + " " + clock, "%Y-%m-%d %H:%M:%S"))
        except (ValueError, OverflowError):
            return None
        return self._note(at)

    def time_only(self, clock):
        if self.date is None:
            ref = self.reference if self.reference is not None else time.time()
            self.date = time.strftime("%Y-%m-%d", time.localtime(ref))
            at = self._epoch(self.date, clock)
            if at is not None and at > ref + 60:  # later than the reference: yesterday's
                self.date = time.strftime("%Y-%m-%d", time.localtime(ref - 86400))
            return self._note(self._epoch(self.date, clock))
        at = self._epoch(self.date, clock)
        if at is not None and self.last is not None and at < self.last - 43200:
            self.date = time.strftime("%Y-%m-%d", time.localtime(at + 86400 + 3600))
            at = self._epoch(self.date, clock)  # past midnight
        return self._note(at)

    def _note(self, at):
        if at is not None:
            self.last = at
        return at


def split_lines(text):
    """Physical lines of a log, one per tqdm redraw (carriage returns) and per log line glued
    to a bar; blank lines dropped."""
    out = []
    for piece in re.split(r"[\r\n]+", text):
        if not piece.strip():
            continue
        if "][" in piece or "]2" in piece or "it/s]" in piece or "s/it]" in piece:
            out.extend(part for part in _GLUED.split(piece) if part.strip())
        else:
            out.append(piece)
    return out


def read_line(raw, clock):
    """Strip the prefixes other tools and SGLang put before the message; date the line."""
    text = (_ANSI.sub("", raw) if "\x1b" in raw else raw).rstrip()
    at = None
    m = _DOCKER_TS.match(text)
    if m:
        at = clock.utc(m.group(1), m.group(2))
        text = text[m.end():]
    m = _COMPOSE.match(text)
    if m:
        text = text[m.end():]
    m = _RAY.match(text)
    if m:
        text = text[m.end():]
    m = _PY_LOGGING.match(text)
    if m:
        outer = m
        text = text[m.end():]
    else:
        outer = None
    m = _STAMP.match(text) or _GPU_ID.match(text)
    if m:
        if at is None and m.re is _STAMP:
            at = (clock.local(m.group(1), m.group(2)) if m.group(1)
                  else clock.time_only(m.group(2)))
        text = text[m.end():]
    if at is None and outer is not None:
        at = clock.local(outer.group(1), outer.group(2))
    return LogLine(raw.strip()[:LINE_LIMIT], text, at)


# ---- runs -------------------------------------------------------------------------------------

_PROGRESSED = re.compile(r"Load weight begin|Init torch distributed begin|Traceback \(most "
                         r"recent call last\)|hit an exception|^Killed$|fired up", re.M)


def _launches(segment):
    """Offsets in a log segment (no separators) where a later launch begins: a second
    `server_args=` line of the main process, once the launch before it got somewhere (the
    offline Engine path can log its arguments twice in one launch)."""
    starts = []
    at = segment.find("server_args=")
    while at >= 0:
        begin = max(segment.rfind("\n", 0, at), segment.rfind("\r", 0, at)) + 1
        end = segment.find("\n", at)
        line = segment[begin:end if end >= 0 else len(segment)]
        if _RUN_START.match(read_line(line, _Clock(0)).message):
            starts.append(begin)
        at = segment.find("server_args=", at + 1)
    return [starts[i] for i in range(1, len(starts))
            if _PROGRESSED.search(segment, starts[i - 1], starts[i])]


def current_run(text):
    """The part of the log written by the last start: after the last supervisor separator and,
    where one log holds several launches without separators (docker logs of a restarted
    container, a service appending to its log), from the last launch's `server_args=` line."""
    at = text.rfind(RUN_SEPARATOR)
    if at >= 0:
        text = text[at:]
    cuts = _launches(text)
    return text[cuts[-1]:] if cuts else text


def count_runs(text):
    """How many starts the log holds: supervisor separators and launches without one."""
    segments = text.split(RUN_SEPARATOR)
    runs = sum(1 + len(_launches(seg)) for seg in segments[1:])
    if segments[0].strip():
        runs += 1 + len(_launches(segments[0]))
    return runs


# ---- the parser -------------------------------------------------------------------------------


class _Traceback:
    """An open traceback: its header's failure (if the header line named one) and frames."""

    def __init__(self, header, header_kind):
        self.header = header
        self.header_kind = header_kind
        self.launch = False


class _Parser:
    def __init__(self, cuda_graph, reference):
        self.cuda_graph = cuda_graph
        self.clock = _Clock(reference)
        self.phase = "launching"
        self.entered_by = None  # the event that entered the current phase
        self.step = None  # capture sub-step
        self.phase_at = None
        self.capture_at = None  # when capture began, kept across its sub-steps
        self.last_at = None
        self.last_is_bar = False
        self.meaningful = 0
        self.bar = None  # current sub-step's bar: (done, total, unit)
        self.shards = self.capture = None
        self.ticks = 0
        self._bar_done = {}
        self.failures = []
        self.failures_total = 0
        self.timeline = []
        self.traceback = None
        self.error_lines = deque(maxlen=10)
        self.last_lines = deque(maxlen=15)

    # -- phases

    def enter(self, phase, event, line, step=None):
        now, target = _PHASE_INDEX[self.phase], _PHASE_INDEX[phase]
        if event == "capture" and self.phase == "starting_http" and \
                self.entered_by == "capture_end":
            self._switch(phase, event, line, step, resumed=True)
        elif target > now:
            self._switch(phase, event, line, step)
        elif phase == self.phase == "capturing_cuda_graph" and step and step != self.step:
            self.step = step  # the next sub-step of capture
            self.bar = None
            self._row(line)

    def _switch(self, phase, event, line, step, resumed=False):
        at = line.at if line.at is not None else self.last_at
        if resumed and self.timeline and self.timeline[-1]["phase"] == "starting_http":
            self.timeline.pop()  # a capture end between two capture sub-steps
        previous = self.timeline[-1] if self.timeline else {}
        self.phase, self.entered_by, self.bar = phase, event, None
        self.step = step if phase == "capturing_cuda_graph" else None
        if phase == "capturing_cuda_graph":
            if not resumed or self.capture_at is None:
                self.capture_at = at
            self.phase_at = self.capture_at  # the ceiling counts the whole capture
        else:
            self.phase_at = at
        if not (resumed and previous.get("phase") == phase and previous.get("step") == self.step):
            self._row(line)  # (else another rank's line for the sub-step under way)

    def _row(self, line):
        self.timeline.append({"phase": self.phase, "step": self.step,
                              "at": line.at if line.at is not None else self.last_at,
                              "line": line.raw[:300], "progress": None})

    # -- line kinds

    def feed(self, raw):
        if raw.startswith(RUN_SEPARATOR):
            return
        line = read_line(raw, self.clock)
        message = line.message
        if _ACCESS.match(message):
            return  # uvicorn access lines: health probes are not the server's progress
        self.meaningful += 1
        self.last_lines.append(line.raw)
        if not self.timeline:  # the run's first line starts its launch
            self.timeline.append({"phase": "launching", "step": None, "at": line.at,
                                  "line": line.raw[:300], "progress": None})
        if line.at is not None:
            if self.phase_at is None:
                self.phase_at = line.at
            if self.timeline[0]["at"] is None:
                self.timeline[0]["at"] = line.at
            self.last_at = line.at
        self.last_is_bar = line.at is None
        bar = _BAR.match(message)
        if bar:
            self.on_bar(bar, line)
            return
        if _FRAME.match(message):
            self.on_frame(message, line)
            return
        if self.traceback is not None and message.startswith("    "):
            return  # a traceback's source line: code, not something the server said
        self.on_message(message, line)

    def on_message(self, message, line):
        for phase, event, pattern in _PHASE_LINES if _ANY_PHASE_LINE.search(message) else ():
            if pattern.search(message):
                step = _capture_step(message) if event == "capture" else None
                self.enter(phase, event, line, step)
                break
        if not self.cuda_graph and self.phase == "allocating_kv_cache" and \
                _POOL_END.match(message):
            self.enter("starting_http", "enter", line)
        kind = self.on_failure(message, line)
        if _ERRORISH.search(message):
            self.error_lines.append(line.raw)
        if self.traceback is not None:
            if _EXCEPTION.match(message):  # the line that ends a traceback
                self.close_traceback(line if kind is None else False)
            elif line.at is not None:  # the server moved on without one
                self.close_traceback(None)
        if _TRACEBACK_HEADER.search(message):
            self.traceback = _Traceback(line, kind)

    def on_failure(self, message, line):
        if not _ANY_FAILURE.search(message):
            return None
        for kind, fatal, phase, pattern in _FAILURES:
            if pattern.search(message):
                self.add_failure(kind, fatal, line)
                if phase is not None:
                    self.enter(phase, "capture" if phase == "capturing_cuda_graph" else "enter",
                               line, self.step)
                return kind
        return None

    def add_failure(self, kind, fatal, line):
        self.failures_total += 1
        self.failures.append({"kind": kind, "fatal": fatal, "line": line.raw,
                              "at": line.at if line.at is not None else self.last_at})

    def close_traceback(self, exception_line):
        """At the exception line that ends a traceback (or the next stamped line): a traceback
        that named no failure is reported once, by its exception line when it has one."""
        tb, self.traceback = self.traceback, None
        if exception_line is False or tb.header_kind is not None:
            return
        line = exception_line or tb.header
        if tb.launch:
            self.add_failure("launch_exception", True, line)
        else:
            self.add_failure("traceback", False, line)

    def on_frame(self, message, line):
        if self.traceback is not None and _LAUNCH_FRAME.search(message):
            self.traceback.launch = True
        for pattern, phase in _FRAMES:
            if pattern.search(message):
                event = "capture" if phase == "capturing_cuda_graph" else "enter"
                self.enter(phase, event, line, self.step if phase == self.phase else None)
                break

    def on_bar(self, m, line):
        done, total = int(m.group("done")), int(m.group("total"))
        desc = (m.group("desc") or "").strip()
        phase, unit = None, (desc[:40] if desc else "steps")
        for pattern, bar_phase, bar_unit in _BARS:
            if desc and pattern.search(desc):
                phase, unit = bar_phase, bar_unit
                break
        if phase is None and not desc and self._before_capture_done():
            phase = "capturing_cuda_graph"  # a capture loop's first draw, before its label
        if phase is not None:
            event = "capture" if phase == "capturing_cuda_graph" else "enter"
            self.enter(phase, event, line, _bar_step(unit) if event == "capture" else None)
        key = (unit, total)
        last = self._bar_done.get(key, 0)
        self.ticks += done - last if done >= last else done
        self._bar_done[key] = done
        if phase == "loading_weights":
            self.shards = [done, total]
        elif phase == "capturing_cuda_graph":
            self.capture = [done, total]
        if phase is None or phase == self.phase:
            self.bar = (done, total, unit)
            if self.timeline:
                self.timeline[-1]["progress"] = {"done": done, "total": total, "unit": unit}

    def _before_capture_done(self):
        index = _PHASE_INDEX[self.phase]
        return (_PHASE_INDEX["allocating_kv_cache"] <= index <= _PHASE_INDEX["capturing_cuda_graph"]
                or (self.phase == "starting_http" and self.entered_by == "capture_end"))

    def result(self):
        if self.traceback is not None:
            self.close_traceback(None)
        failures = self.failures
        if len(failures) > 40:  # the first lines are the cause, the last the latest state
            failures = failures[:25] + failures[-15:]
        progress = None
        if self.bar is not None:
            progress = {"done": self.bar[0], "total": self.bar[1], "unit": self.bar[2]}
        return {
            "phase": self.phase,
            "step": self.step,
            "progress": progress,
            # Monotonic count of bar advances across every bar of the run: a new sub-step's
            # bar restarting at 0 is not a step back.
            "progress_ticks": self.ticks,
            "shards": self.shards,
            "capture": self.capture,
            "failures": failures,
            "failures_total": self.failures_total,
            "fatal": any(f["fatal"] for f in self.failures),
            "meaningful_lines": self.meaningful,
            # Epoch seconds of the line that entered the phase (capture: its first sub-step)
            # and of the last dated line; whether the last meaningful line is an undated bar.
            "phase_started_at": self.phase_at,
            "last_line_at": self.last_at,
            "last_line_is_bar": self.last_is_bar,
            "timeline": self.timeline,
            "error_lines": list(self.error_lines),
            "last_lines": list(self.last_lines),
        }


def _capture_step(message):
    if message.startswith("Capture cuda graph bs"):
        return "decode"
    if message.startswith("Capture cuda graph num tokens"):
        return "piecewise"
    if message.startswith("Capturing ") and "prefill" in message:
        return "prefill"
    m = _CAPTURE_STEP.match(message)
    words = (m.group(1) if m else "").lower().replace("target ", "").strip()
    return words or "decode"  # 0.5.4's "Capture cuda graph begin" captures decode graphs


def _bar_step(unit):
    return {"batches": "decode", "prefill shapes": "prefill", "shapes compiled": "piecewise",
            "piecewise shapes": "piecewise"}.get(unit)


def parse_log(text, cuda_graph=True, now=None):
    """Phase, progress and failures of the current run of one server log. `now` dates
    time-only stamps when the log has no full date (default: the current time)."""
    parser = _Parser(cuda_graph, now)
    for raw in split_lines(current_run(text)):
        parser.feed(raw)
    return parser.result()


def fatal_failures(parsed, since=None):
    """The fatal failures of a parsed run, leaving out lines dated before `since` (epoch
    seconds): a log appended to across restarts without separators keeps older runs' lines."""
    out = []
    for failure in parsed["failures"]:
        if not failure["fatal"]:
            continue
        if since is not None and failure["at"] is not None and failure["at"] + 2 < since:
            continue
        out.append(failure)
    return out


def phase_timeline(text):
    """(phase, line) for every line of the current run that entered a phase, in order."""
    return [(row["phase"], row["line"]) for row in parse_log(text)["timeline"]]


def progress_text(parsed):
    """Short human progress, e.g. 'loading_weights 27/61 shards'."""
    phase = parsed["phase"]
    progress = parsed.get("progress")
    if progress:
        return "%s %d/%d %s" % (phase, progress["done"], progress["total"], progress["unit"])
    return phase
