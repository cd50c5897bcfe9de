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

from ..common import vocab
from ..common.text import inert
from . import failures as failures_grammar

# The failure grammar lives in module_utils/logs/failures; its names are read here too.
FAILURES = failures_grammar.FAILURES
FATAL_KINDS = failures_grammar.FATAL_KINDS
FAILURE_WHY = failures_grammar.FAILURE_WHY
FAILURE_HINTS = failures_grammar.FAILURE_HINTS

RUN_SEPARATOR = "===== sglang-fleet: start "
# The line a bounded read puts where it left bytes out (module_utils/logs/logread).
GAP_MARKER = "~~~~~ sglang-fleet: "

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

# ---- line shapes ------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Prefixes other tools add before SGLang's own line, outermost first.
_DOCKER_TS = re.compile(r"^(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d) ")
_COMPOSE = re.compile(r"^[A-Za-z0-9][\w.-]*[-_]\d+ *\| ?")
_PM2 = re.compile(r"^\d+\|[\w.-]+ *\| ?")
_RAY = re.compile(r"^\((?:[\w.]+ )?pid=\d+(?:, ip=[\d.:a-fA-F]+)?\) ")
_PY_LOGGING = re.compile(r"^(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d),\d{3} - (?:[\w.]+ - )?"
                         r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) - ")
# SGLang: "[%(asctime)s{.ms}{ DP0 PP0 ATTN_CP0 MOE_DP0 TP0 EP0}] " (utils configure_logger);
# some wrappers keep only the time; old releases printed "[gpu_id=N] ".
_STAMP = re.compile(r"^\[(?:(\d{4}-\d\d-\d\d) )?(\d\d:\d\d:\d\d)(?:[.,]\d+)?"
                    r"((?: [A-Z][A-Z_]*\d+)*)\] ?")
_GPU_ID = re.compile(r"^\[gpu_id=(\d+)\] ?")
# torch's C++ logging (glog), with the rank prefix torchrun-style launchers add:
# "[rank3]:[E1130 04:12:55.771201000 ProcessGroupNCCL.cpp:632] ".
_TORCH_CPP = re.compile(r"^(?:\[rank(\d+)\]:)?\[[EWIF]\d{4} \d\d:\d\d:\d\d\.\d+(?: +\d+)? "
                        r"[\w.]+:\d+\] ")
_TORCH_RANK = re.compile(r"^\[rank(\d+)\]: ?")
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
_CHAINED = re.compile(r"^(?:The above exception was the direct cause of the following "
                      r"exception|During handling of the above exception, another exception "
                      r"occurred)")
_ACCESS = re.compile(r'^INFO:\s+\S+ - "')
# uvicorn's access line for a client's request that the server answered: warm-up posts only
# /generate (or /encode, or one /v1/chat/completions for a VLM), so an OpenAI endpoint
# answered 2xx more than once is a client served.
_CLIENT_ANSWER = re.compile(r'^INFO:\s+\S+ - "POST /v1/\S+ HTTP/[\d.]+" 2\d\d\b')
_RUN_START = re.compile(r"^server_args=")
_LAUNCH_FRAME = re.compile(r'launch_server\.py", line \d+,? in <module>$|'
                           r'[/\\]sglang[/\\]cli[/\\]main\.py", line \d+,? in main$')
_ERRORISH = re.compile(r"Error|Exception|Traceback|failed|FAILED|Killed|terminate called|"
                       r"已杀死")
# A requested stop (tokenizer_manager.py SignalHandler and sigterm_watchdog; engine.py for the
# ranks of other nodes): the exits that follow it are the stop's, not failures.
_STOP = re.compile(r"SIGTERM received\. .*Draining requests|Gracefully exiting\.\.\. Remaining "
                   r"number of requests|SIGTERM received on node_rank \d+|Signal SIGTERM "
                   r"received while (?:health check failed|force shutdown flag set)")
# The scheduler's batch lines with their running requests (scheduler_metrics_mixin): warm-up
# sends one request of 8 tokens per DP rank (http_server._execute_server_warmup), so a prefill
# beside a running request, two running requests in a decode batch, or more decode lines than
# warm-up's 8 tokens could print, mean clients are being served.
_BATCH_LOAD = re.compile(r"^(Prefill|Decode) batch(?: \[\d+\])?[.,] .*?#running-req: (\d+)")
WARMUP_TOKENS = 8
# The prefill of /health's own request (http_server.health_generate: input_ids [0], one token,
# nothing else running): the scheduler logs one per probe, so these answer the gate's probes
# and are not the server's progress (a deadlocked detokenizer leaves the schedulers printing
# them while nothing comes out).
_PROBE_PREFILL = re.compile(r"^Prefill batch(?: \[\d+\])?[.,] #new-seq: 1, #new-token: 1, "
                            r"#cached-token: 0, .*#running-req: 0, #queue-req: 0,")
# Characters of one physical line read: the rest of a longer line (binary data, a request
# logged whole) is not looked at.
READ_LINE_LIMIT = 16384

# A multi-node server's group, as its arguments line names it (0.5.23 `server_args={'nnodes':
# 2, ...}`, 0.5.4 `server_args=ServerArgs(nnodes=2, ...)`), and its ranks' distributed start
# (0.5.23 distributed/bootstrap.py "Init parallel begin." / "Init parallel ends. ...", 0.5.4
# model_runner.py "Init torch distributed begin." / "... ends. ..."): every rank waits there
# until the whole group has joined torch's store at --dist-init-addr.
_GROUP_ARGS = dict((name, re.compile(r"\b%s['\"]?\s*[:=]\s*(%s)" % (name, value)))
                   for name, value in (("nnodes", r"\d+"), ("node_rank", r"\d+"),
                                       ("tp_size", r"\d+"), ("pp_size", r"\d+"),
                                       ("dist_init_addr", r"'[^']*'|\"[^\"]*\"|None")))
_DIST_BEGIN = re.compile(r"^Init (?:parallel|torch distributed) begin\b")
_DIST_END = re.compile(r"^Init (?:parallel|torch distributed) ends\b")

_PHASE_LINES = [(phase, event, re.compile(p)) for phase, event, p in PHASE_LINES]
# One search per line first: most lines of a long log match none of the patterns.
_ANY_PHASE_LINE = re.compile("|".join("(?:%s)" % p for _, _, p in PHASE_LINES))
_BARS = [(re.compile(p), phase, unit) for p, phase, unit in BARS]
_FRAMES = [(re.compile(p), phase) for p, phase in FRAMES]
_POOL_END = re.compile(r"^Memory pool end\b")
_CAPTURE_STEP = re.compile(r"(?i)^Capture (.*?) ?(?:cuda|cpu) graph")


class LogLine:
    """One logical line: its text as written (made inert), the message under the prefixes,
    its stamp, the rank its prefix names, and its line number in the text read."""

    __slots__ = ("raw", "message", "at", "rank", "number")

    def __init__(self, raw, message, at, rank=None, number=None):
        self.raw = raw
        self.message = message
        self.at = at  # epoch seconds of its own (or its wrapper's) stamp, else None
        self.rank = rank  # "TP3", "DP1 TP0", "rank11", "GPU0", or None
        self.number = number


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


def numbered_lines(text, first=1):
    """(line number, physical line) of a log: one per tqdm redraw (carriage returns) and per
    log line glued to a bar, numbered by the newline-ended line they are on; blank lines
    dropped; each cut at READ_LINE_LIMIT characters."""
    number = first - 1
    for line in text.split("\n"):
        number += 1
        if len(line) > READ_LINE_LIMIT:
            line = line[:READ_LINE_LIMIT]
        for piece in line.split("\r"):
            if not piece.strip():
                continue
            if "][" in piece or "]2" in piece or "it/s]" in piece or "s/it]" in piece:
                for part in _GLUED.split(piece):
                    if part.strip():
                        yield number, part
            else:
                yield number, piece


def split_lines(text):
    """Physical lines of a log, one per tqdm redraw and per log line glued to a bar."""
    return [piece for _, piece in numbered_lines(text)]


def _strip_wrappers(text, clock):
    """(text, epoch or None) without the prefixes docker, compose, pm2, ray and Python
    logging wrappers put before SGLang's own line."""
    at = None
    m = _DOCKER_TS.match(text)
    if m:
        at = clock.utc(m.group(1), m.group(2))
        text = text[m.end():]
    for wrapper in (_COMPOSE, _PM2, _RAY):
        m = wrapper.match(text)
        if m:
            text = text[m.end():]
    m = _PY_LOGGING.match(text)
    if m:
        text = text[m.end():]
        if at is None:
            at = clock.local(m.group(1), m.group(2))
    return text, at


def read_line(raw, clock, number=None):
    """Strip the prefixes other tools and SGLang put before the message; date the line and
    name the rank its prefix shows."""
    text = (_ANSI.sub("", raw) if "\x1b" in raw else raw).rstrip()
    text, at = _strip_wrappers(text, clock)
    rank = None
    m = _STAMP.match(text)
    if m:
        if at is None:
            at = (clock.local(m.group(1), m.group(2)) if m.group(1)
                  else clock.time_only(m.group(2)))
        rank = m.group(3).strip() or None
        text = text[m.end():]
    else:
        m = _GPU_ID.match(text) or _TORCH_CPP.match(text) or _TORCH_RANK.match(text)
        if m:
            if m.group(1) is not None:
                rank = ("GPU" if m.re is _GPU_ID else "rank") + m.group(1)
            text = text[m.end():]
    return LogLine(inert(raw.strip(), keep_newlines=False)[:LINE_LIMIT], text, at, rank,
                   number)


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
        if _RUN_START.match(read_line(line[:READ_LINE_LIMIT], _Clock(0)).message):
            starts.append(begin)
        at = segment.find("server_args=", at + 1)
    return [starts[i] for i in range(1, len(starts))
            if _PROGRESSED.search(segment, starts[i - 1], starts[i])]


def run_offset(text):
    """Where the last start's part of the log begins: after the last supervisor separator
    and, where one log holds several launches without separators (docker logs of a restarted
    container, a service appending to its log), at the last launch's `server_args=` line."""
    at = max(0, text.rfind(RUN_SEPARATOR))
    cuts = _launches(text[at:])
    return at + cuts[-1] if cuts else at


def current_run(text):
    """The part of the log written by the last start."""
    return text[run_offset(text):]


def count_runs(text):
    """How many starts the log holds: supervisor separators and launches without one."""
    segments = text.split(RUN_SEPARATOR)
    runs = sum(1 + len(_launches(seg)) for seg in segments[1:])
    if segments[0].strip():
        runs += 1 + len(_launches(segments[0]))
    return runs


# ---- the parser -------------------------------------------------------------------------------


class _Traceback:
    """An open traceback: the line that announced it (its failure kind, if it named one),
    whether a request's error announced it, its frames, and its exception lines so far."""

    def __init__(self, header, header_kind, header_fatal, request):
        self.header = header
        self.header_kind = header_kind
        self.header_fatal = header_fatal
        self.request = request
        self.launch = False
        self.frames = 0
        self.exceptions = []  # (line, text, kind or None, fatal, phase)
        self.failure = None  # the failure it was said as, once closed


def node_ranks(node, nnodes, tp, pp):
    """The log prefixes ("TP8", "PP1 TP0") of node rank `node`'s schedulers, as SGLang's
    engine.py _calculate_rank_ranges places them."""
    nodes_per_pp_rank = max(nnodes // pp, 1)
    pp_per_node = max(pp // nnodes, 1)
    tp_per_node = tp // nodes_per_pp_rank
    first_pp = pp_per_node * (node // nodes_per_pp_rank)
    first_tp = tp_per_node * (node % nodes_per_pp_rank)
    names = []
    for p in range(first_pp, first_pp + pp_per_node):
        for t in range(first_tp, first_tp + tp_per_node):
            names.append(" ".join(([("PP%d" % p)] if pp > 1 else []) +
                                  ([("TP%d" % t)] if tp > 1 else [])))
    return names


class _Group:
    """A multi-node server's group and the ranks of this node that began and ended their
    distributed start."""

    def __init__(self):
        self.args = {}
        self.began = []
        self.ended = set()

    def feed(self, message, rank):
        if _RUN_START.match(message):
            for name, pattern in _GROUP_ARGS.items():
                m = pattern.search(message)
                if m:
                    value = m.group(1).strip("'\"")
                    self.args[name] = value if name == "dist_init_addr" else int(value)
        elif _DIST_BEGIN.match(message):
            if rank not in self.began:
                self.began.append(rank)
        elif _DIST_END.match(message):
            self.ended.add(rank)

    def waiting(self, phase):
        """While this node's ranks wait for the rest of a multi-node group: where, the
        ranks here, the ranks of the other nodes and those nodes' ranks; else None."""
        nnodes = self.args.get("nnodes") or 1
        here = [r for r in self.began if r not in self.ended]
        if phase != "launching" or nnodes < 2 or not here:
            return None
        node = self.args.get("node_rank") or 0
        tp, pp = self.args.get("tp_size") or 1, self.args.get("pp_size") or 1
        others = [n for n in range(nnodes) if n != node]
        missing = [name for n in others for name in node_ranks(n, nnodes, tp, pp)]
        return {"addr": self.args.get("dist_init_addr"),
                "here": failures_grammar.ranks_text([r for r in here if r]),
                "missing": failures_grammar.ranks_text([m for m in missing if m]),
                "node_ranks": others}


def rendezvous_text(waiting):
    """'TP0-7 wait at the rendezvous on 10.0.0.1:20000 for TP8-15 (node rank 1)'."""
    nodes = waiting["node_ranks"]
    which = ("node rank %d" % nodes[0] if len(nodes) == 1 else
             "node ranks %s" % ",".join(str(n) for n in nodes))
    return "%s wait at the rendezvous on %s for %s (%s)" % (
        waiting["here"] or "its ranks", waiting["addr"] or "--dist-init-addr",
        waiting["missing"] or "the other nodes' ranks", which)


class _Parser:
    def __init__(self, cuda_graph, reference):
        self.cuda_graph = cuda_graph
        self.clock = _Clock(reference)
        self.phase = "launching"
        self.entered_by = None  # the event that entered the current phase
        self.step = None  # capture sub-step
        self.done_steps = set()  # capture sub-steps whose end was logged
        self.phase_at = None
        self.capture_at = None  # when capture began, kept across its sub-steps
        self.last_at = None
        self.last_is_bar = False
        self.meaningful = 0
        self.probe_prefills = 0  # of them, the prefills of /health's requests
        self.bar = None  # current sub-step's bar: (done, total, unit)
        self.shards = self.capture = None
        self.ticks = 0
        self._bar_done = {}
        self.failures = []
        self.failures_total = 0
        self.kv_transfer = None  # PD: the KV transfer failures of requests, counted
        self.timeline = []
        self.traceback = None
        self.chained = None  # a closed traceback that a chained one continues
        self.after_request_error = False
        self.stop = None  # the line of a requested stop (SIGTERM), once seen
        self.decode_lines = 0
        self.client_answers = 0
        self.group = _Group()
        self.lines_from = "file"  # what line numbers count from
        self.error_lines = deque(maxlen=10)
        self.last_lines = deque(maxlen=15)

    # -- phases

    def enter(self, phase, event, line, step=None):
        now, target = _PHASE_INDEX[self.phase], _PHASE_INDEX[phase]
        if event == "capture_end":
            self.end_capture(line, step)
        elif event == "capture" and self.phase == "starting_http" and \
                self.entered_by == "capture_end":
            if step not in self.done_steps:  # (else a lagging rank's bar for a finished step)
                self._switch(phase, event, line, step, resumed=True)
        elif target > now:
            self._switch(phase, event, line, step)
        elif phase == self.phase == "serving" and event != "load":
            self.entered_by = event  # the ready line, or clients answered: it served
        elif phase == self.phase == "capturing_cuda_graph" and step and step != self.step \
                and step not in self.done_steps:
            self.step = step  # the next sub-step of capture
            self.bar = None
            self._row(line)

    def end_capture(self, line, step):
        """A capture sub-step's end: it leaves capture when it ends the sub-step under way
        (another rank's end of a sub-step already left says nothing new)."""
        self.done_steps.add(step)
        if self.phase == "capturing_cuda_graph" and self.step not in (None, step):
            return  # a lagging rank ends the sub-step before the one under way
        if _PHASE_INDEX["starting_http"] > _PHASE_INDEX[self.phase]:
            self._switch("starting_http", "capture_end", line, None)

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
                              "line": line.raw[:300], "line_no": line.number,
                              "progress": None})

    # -- line kinds

    def feed(self, raw, number=None):
        if raw.startswith(RUN_SEPARATOR) or raw.startswith(GAP_MARKER):
            return
        line = read_line(raw, self.clock, number)
        message = line.message
        if _ACCESS.match(message):
            # uvicorn access lines: health probes are not the server's progress, but
            # clients' answered requests say it serves (a log that shows only those, at
            # --log-level warning, or a tail that begins after the ready line).
            if _CLIENT_ANSWER.match(message):
                self.client_answers += 1
                if self.client_answers > 1:
                    self._launch_row(line)
                    self.enter("serving", "client", line)
            return
        self.meaningful += 1
        if _PROBE_PREFILL.match(message):
            self.probe_prefills += 1
        self.last_lines.append(line.raw)
        self._launch_row(line)
        if line.at is not None:
            if self.phase_at is None:
                self.phase_at = line.at
            if self.timeline[0]["at"] is None:
                self.timeline[0]["at"] = line.at
            self.last_at = line.at
        self.last_is_bar = line.at is None
        if failures_grammar.is_request_log(message):
            return  # SGLang's record of a request: client data, never a failure or a phase
        bar = _BAR.match(message)
        if bar:
            self.on_bar(bar, line)
            return
        if _FRAME.match(message):
            self.on_frame(message, line)
            return
        if self.traceback is not None and message.startswith((" ", "\t")):
            return  # a traceback's source line: code, not something the server said
        self.on_message(message, line)

    def _launch_row(self, line):
        if not self.timeline:  # the run's first line starts its launch
            self.timeline.append({"phase": "launching", "step": None, "at": line.at,
                                  "line": line.raw[:300], "line_no": line.number,
                                  "progress": None})

    def on_message(self, message, line):
        self.group.feed(message, line.rank)
        for phase, event, pattern in _PHASE_LINES if _ANY_PHASE_LINE.search(message) else ():
            if pattern.search(message):
                step = _capture_step(message) if event.startswith("capture") else None
                self.enter(phase, event, line, step)
                break
        if not self.cuda_graph and self.phase == "allocating_kv_cache" and \
                _POOL_END.match(message):
            self.enter("starting_http", "enter", line)
        self.on_serving_load(message, line)
        if _ERRORISH.search(message):
            self.error_lines.append(line.raw)
        if self.traceback is not None and self.on_traceback_line(message, line):
            return
        self.after_request_error = (failures_grammar.is_request_error(message) or
                                    (self.after_request_error and line.at is None))
        if self.stop is None and _STOP.match(message):
            self.stop = {"line": line.raw, "at": line.at, "line_no": line.number}
        if self.chained is not None and _CHAINED.match(message):
            return  # the next traceback continues the one before
        found = self.on_failure(message, line)
        if _TRACEBACK_HEADER.search(message):
            self.open_traceback(line, found)
            return
        if line.at is not None or found is not None:
            self.chained = None  # (else the rest of a multi-line exception message)
        if found is not None and not self.after_request_error:
            if found[0] in failures_grammar.KV_TRANSFER_KINDS:
                self.on_kv_transfer(found[0], line, message)
            else:
                self.add_failure(found[0], found[1], line, message)

    def on_kv_transfer(self, kind, line, message):
        """A PD request's KV transfer failed (or its prefill could not be looked up): counted,
        with the prefills the lines name and the latest line."""
        kv = self.kv_transfer
        counters = failures_grammar.KV_TRANSFER_COUNTERS
        if kv is None:
            kv = self.kv_transfer = dict(((c, 0) for c in counters.values()), prefills={})
        kv[counters[kind]] += 1
        peer = failures_grammar.kv_peer(message)
        if peer:
            kv["prefills"][peer] = kv["prefills"].get(peer, 0) + 1
        kv.update(last_line=line.raw[:LINE_LIMIT], last_message=_said(message),
                  last_at=line.at if line.at is not None else self.last_at)
        if kind == "kv_transfer_failed":
            kv["last_request_line"] = line.raw[:LINE_LIMIT]

    def on_serving_load(self, message, line):
        """Decode lines with more load than warm-up makes: the server is serving clients."""
        m = _BATCH_LOAD.match(message)
        if m is None or self.phase == "serving":
            return
        running = int(m.group(2))
        if m.group(1) == "Decode":
            self.decode_lines += 1
            busy = running >= 2 or self.decode_lines > WARMUP_TOKENS
        else:
            busy = running >= 1  # another request runs beside the one being prefilled
        if busy:
            self.enter("serving", "load", line)

    def on_failure(self, message, line):
        """(kind, fatal, phase) of a failure line, or None; enters the phase it shows."""
        found = failures_grammar.match(message, failures_grammar.exception_message(message))
        if found is not None and found[0] == "warmup_failed":
            self.never_served()
        if found is not None and found[2] is not None and not self.after_request_error:
            phase = found[2]
            self.enter(phase, "capture" if phase == "capturing_cuda_graph" else "enter",
                       line, self.step)
        return found

    def never_served(self):
        """A failed warm-up: a server read as serving from its batch lines' load alone never
        served (warm-up's own requests made that load; its ready line never came)."""
        if self.phase != "serving" or self.entered_by != "load":
            return
        if self.timeline and self.timeline[-1]["phase"] == "serving":
            self.timeline.pop()
        previous = self.timeline[-1] if self.timeline else {}
        self.phase, self.entered_by = "warming_up", "enter"
        self.phase_at = previous.get("at", self.phase_at)

    def on_traceback_line(self, message, line):
        """A line inside an open traceback; True when it was the traceback's."""
        tb = self.traceback
        if line.at is not None:  # the server moved on: a new record closes it
            self.close_traceback()
            return False
        if tb.frames == 0 and not tb.exceptions and \
                failures_grammar.exception_message(message) is None:
            return False  # no frame yet and no exception: not a traceback's body
        if _CHAINED.match(message):
            return True
        m = failures_grammar.EXCEPTION_LINE.match(message)
        if m is None:
            return True  # an exception's message going on over several lines
        found = failures_grammar.match(message, m.group("msg") or "")
        if found is not None and found[2] is not None and not tb.request:
            self.enter(found[2], "capture" if found[2] == "capturing_cuda_graph" else "enter",
                       line, self.step)
        tb.exceptions.append((line, message) + (found or (None, False, None)))
        self.close_traceback()
        return True

    def open_traceback(self, line, found):
        if self.traceback is not None:
            self.close_traceback()
        if self.chained is not None and found is None:
            self.traceback, self.chained = self.chained, None
            return
        self.chained = None
        kind, fatal = (found[0], found[1]) if found else (None, False)
        self.traceback = _Traceback(line, kind, fatal, self.after_request_error)

    def close_traceback(self):
        """A traceback said as one failure: the kind its final exception names when that is a
        known one, else the kind its header named, else a launch's or a request's traceback;
        its text is the final exception line. A chained traceback ("The above exception was
        the direct cause ...") that follows it replaces that failure with the longer chain."""
        tb, self.traceback = self.traceback, None
        known = [e for e in tb.exceptions if e[2] is not None]
        final = tb.exceptions[-1] if tb.exceptions else None
        if known:
            kind, fatal = known[-1][2], known[-1][3] or tb.header_fatal
        elif tb.header_kind is not None:
            kind, fatal = tb.header_kind, tb.header_fatal
        elif tb.launch:
            kind, fatal = "launch_exception", True
        else:
            kind, fatal = "traceback", False
        if tb.request:
            fatal = False  # a request's error: the server goes on
        if tb.failure is not None:  # the chain's earlier part, said again with its end
            self.failures.remove(tb.failure)
            self.failures_total -= 1
        tb.failure = self.add_failure(kind, fatal, final[0] if final else tb.header,
                                      tb.header.message, dated=tb.header)
        tb.failure.update(traceback=True, exception=_said(final[1]) if final else None)
        if final is not None and tb.exceptions[0][1] != final[1]:
            tb.failure["chain_began_with"] = _said(tb.exceptions[0][1])
        self.chained = tb if final is not None else None

    def add_failure(self, kind, fatal, line, message, dated=None):
        """Record one failure line (or one traceback, by its final line; dated by its
        header)."""
        dated = dated or line
        failure = {"kind": kind, "fatal": fatal, "line": line.raw, "message": _said(message),
                   "at": dated.at if dated.at is not None else self.last_at,
                   "line_no": line.number, "lines_from": self.lines_from, "rank": dated.rank,
                   "exception": None, "traceback": False}
        if self.stop is not None and kind in failures_grammar.CONSEQUENCE_KINDS:
            failure.update(fatal=False, during_stop=True)  # the stop's own exits
        if kind == "killed" and any(f["fatal"] for f in self.failures):
            failure["after_sglang_failure"] = True
        self.failures_total += 1
        self.failures.append(failure)
        return failure

    def on_frame(self, message, line):
        if self.traceback is not None:
            self.traceback.frames += 1
            if _LAUNCH_FRAME.search(message):
                self.traceback.launch = True
        for pattern, phase in _FRAMES:
            if pattern.search(message):
                if self.traceback is not None and self.traceback.request:
                    break
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
        step = _bar_step(unit) if phase == "capturing_cuda_graph" else None
        if self._draws_for_step_under_way(step):
            # A speculative draft model's capture draws the target's "Capturing batches"
            # bar: it is the progress of the sub-step under way, not a lagging rank's.
            step = self.step
        if phase == "capturing_cuda_graph" and self._capture_finished(step):
            return  # a lagging rank's bar for a sub-step whose end was logged
        if phase is not None:
            event = "capture" if phase == "capturing_cuda_graph" else "enter"
            self.enter(phase, event, line, step)
        key = (unit, total)
        last = self._bar_done.get(key, 0)
        self.ticks += done - last if done >= last else done
        self._bar_done[key] = done
        shown = self._shown_count(done, total, unit)
        if phase == "loading_weights":
            self.shards = [shown, total]
        elif phase == "capturing_cuda_graph":
            self.capture = [shown, total]
        if phase is None or phase == self.phase:
            self.bar = (shown, total, unit)
            if self.timeline:
                self.timeline[-1]["progress"] = {"done": shown, "total": total, "unit": unit}

    def _draws_for_step_under_way(self, step):
        return (step is not None and self.phase == "capturing_cuda_graph"
                and self.step not in (None, step) and self.step not in self.done_steps
                and step in self.done_steps and self.step.endswith(step))

    def _shown_count(self, done, total, unit):
        """The count a sub-step shows: the highest its bar reached (ranks draw the same bar;
        a lagging rank's 1/2 after a printed 2/2 is not a step back)."""
        if self.bar is not None and self.bar[1:] == (total, unit) and self.bar[0] > done:
            return self.bar[0]
        return done

    def _capture_finished(self, step):
        finished = self.phase == "starting_http" and self.entered_by == "capture_end"
        if finished and (step is None or step in self.done_steps):
            return True
        return step is not None and step in self.done_steps and step != self.step

    def _before_capture_done(self):
        index = _PHASE_INDEX[self.phase]
        return (_PHASE_INDEX["allocating_kv_cache"] <= index <= _PHASE_INDEX["capturing_cuda_graph"]
                or (self.phase == "starting_http" and self.entered_by == "capture_end"))

    def result(self):
        if self.traceback is not None:
            self.close_traceback()
        folded = failures_grammar.fold(self.failures)
        if len(folded) > 40:  # the first lines are the cause, the last the latest state
            folded = folded[:25] + folded[-15:]
        cause = failures_grammar.cause(folded)
        if cause is not None:
            cause = dict(cause, said=failures_grammar.said(cause),
                         hint=failures_grammar.hint(cause, self.phase))
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
            "failures": folded,
            "failures_total": self.failures_total,
            "kv_transfer": self.kv_transfer,
            "fatal": any(f["fatal"] for f in folded),
            # The failure that ended the server, said once (`said`), with what to do (`hint`).
            "cause": cause,
            # A requested stop's line (SIGTERM, graceful exit), when the log has one.
            "stop": self.stop,
            # While this node's ranks wait for the rest of a multi-node group to join.
            "rendezvous": None if any(f["fatal"] for f in folded)
            else self.group.waiting(self.phase),
            "meaningful_lines": self.meaningful,
            "probe_prefills": self.probe_prefills,
            # Epoch seconds, as the log's own stamps say, of the line that entered the phase
            # (capture: its first sub-step) and of the last dated line; whether the last
            # meaningful line is an undated bar. Shown, never used to judge time: the gate
            # measures time on the node's monotonic clock.
            "phase_started_at": self.phase_at,
            "last_line_at": self.last_at,
            "last_line_is_bar": self.last_is_bar,
            "timeline": self.timeline,
            "error_lines": list(self.error_lines),
            "last_lines": list(self.last_lines),
        }


def _said(text):
    return inert(text, keep_newlines=False)[:LINE_LIMIT]


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


def gap_line(skipped):
    """The line that stands for `skipped` bytes a bounded read left out."""
    return "\n%s%d bytes of the log not read ~~~~~\n" % (GAP_MARKER, skipped)


def _parts(text, lines_from):
    """(text, first line number, what the numbers count from) of the current run's parts:
    one, or the head and the tail of a log read with a gap between them."""
    at = text.find(GAP_MARKER)
    if at < 0:
        offset = run_offset(text)
        return [(text[offset:], 1 + text.count("\n", 0, offset), lines_from)]
    head, tail = text[:at], text[text.find("\n", at) + 1:]
    tail_label = "the part read after the gap"
    offset = run_offset(tail)
    if offset > 0 or tail.lstrip("\n").startswith(RUN_SEPARATOR):  # the run began in the tail
        return [(tail[offset:], 1 + tail.count("\n", 0, offset), tail_label)]
    offset = run_offset(head)
    return [(head[offset:], 1 + head.count("\n", 0, offset), lines_from),
            (tail, 1, tail_label)]


def parse_log(text, cuda_graph=True, now=None, lines_from="file"):
    """Phase, progress and failures of the current run of one server log. `now` dates
    time-only stamps when the log has no full date (default: the current time).
    `lines_from` says what the text's line numbers count from: "file" when it is the whole
    file, else e.g. "this run" (read from where the run began)."""
    parser = _Parser(cuda_graph, now)
    for part, first, label in _parts(text, lines_from):
        parser.lines_from = label
        for number, raw in numbered_lines(part, first):
            parser.feed(raw, number)
    return parser.result()


def fatal_failures(parsed, since=None):
    """The fatal failures of a parsed run, leaving out lines dated before `since` (epoch
    seconds, by the log's own stamps): only for a log read as a whole, where an earlier run
    without a separator may remain. The gate reads from the start's byte offset instead."""
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
    if parsed.get("rendezvous"):
        return "%s: %s" % (phase, rendezvous_text(parsed["rendezvous"]))
    if progress:
        return "%s %d/%d %s" % (phase, progress["done"], progress["total"], progress["unit"])
    return phase
