# -*- coding: utf-8 -*-
# The failure lines of an SGLang server log: which lines are failures, whether SGLang's own code
# ends the server after printing them, and how one failure is said (the exception's own final
# line, the ranks that printed it, the log line, and what to do).
#
# A failure pattern matches only where SGLang (or the runtime under it) writes it: at the start
# of a log record's message, at the start of a traceback's final exception line (its type, or
# its message after "Type: "), or as a whole line that a shell, libstdc++ or torch's C++ logging
# prints. Never inside a logged request, prompt, output or argument: SGLang's request log
# (--log-requests: "Receive: obj=...", "Finish: obj=...", JSON records) and the message of a
# request's error are never read for failures, and a traceback out of a request handler
# ("Exception in ASGI application") is not fatal whatever it ends with.
# Texts checked against SGLang 0.5.23 (managers/scheduler.py, tokenizer_manager.py,
# detokenizer_manager.py, data_parallel_controller.py, entrypoints/engine.py, http_server.py,
# utils/watchdog.py, utils/request_logger.py, mem_cache/kv_cache_configurator.py) and 0.4.x
# (managers/tp_worker_overlap_thread.py, entrypoints/engine.py). Python 3.8 syntax.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

# (kind, fatal, phase the line shows the server reached or None, pattern, why it is or is not
# fatal). A line takes the first kind that matches; patterns are anchored (re.match) at the
# start of the message or of the exception's message. This table is the one definition of
# failure kinds and fatality.
FAILURES = (
    ("scheduler_exception", True, None, r"(?:Scheduler|TpModelWorkerClient) hit an exception",
     "run_scheduler_process logs it, then SIGQUITs its parent, which kills the process tree; "
     "with dp_size > 1 the main process can stay up with a dead scheduler (0.4.x: the overlap "
     "thread's TpModelWorkerClient does the same)"),
    ("subprocess_exception", True, None,
     r"(?:DataParallelController|TokenizerManager|DetokenizerManager|MultiTokenizerRouter|"
     r"MultiDetokenizerRouter) hit an exception",
     "the process ends and SIGQUITs its parent (the tokenizer kills the whole tree itself)"),
    ("warmup_failed", True, "warming_up", r"Initialization failed\. warmup error",
     "http_server kills its own process tree after a failed warm-up"),
    ("capture_failed", True, "capturing_cuda_graph", r"Capture (?i:cuda graph) failed",
     "raised out of the model runner's initialisation: the scheduler dies"),
    ("kv_pool_too_small", True, "allocating_kv_cache",
     r"Not enough memory\. Please try to increase --mem-fraction-static|"
     r"Loaded weights leave no GPU memory for the KV cache",
     "raised while sizing the KV pool: the scheduler dies before serving"),
    ("kv_alloc_oom", True, None,
     r"(?:Prefill|Decode) out of memory\. Try to lower your batch size",
     "logged, then raised as RuntimeError in the scheduler loop: the scheduler dies"),
    ("gpu_error", True, None,
     r"(?:CUDA error: )?(?:uncorrectable ECC error encountered|GPU is lost)|"
     # torch's NCCL watchdog thread (ProcessGroupNCCL.cpp, its glog line and the what() of
     # the DistBackendError it throws) and the custom all-reduce's CUDACHECK (its printf
     # then exit) name the GPU's own error: that is the cause, not the abort after it.
     r"(?:\s*what\(\):\s+)?(?:\[[^\]]*Rank \d+\] )?(?:Process group|NCCL) watchdog thread "
     r"terminated with exception: CUDA error: (?:uncorrectable ECC error encountered|GPU is "
     r"lost)|Failed: Cuda error \S+ '(?:uncorrectable ECC error encountered|GPU is lost)'|"
     r"HSA_STATUS_ERROR_\w+|:\d+:rocdevice\.cpp\s*:\d+: .*HSA_STATUS_ERROR",
     "the GPU itself failed (ECC, lost device, a ROCm hardware exception): the rank dies"),
    ("cuda_oom", True, None,
     r"[\w.]*OutOfMemoryError\b|CUDA out of memory|CUDA error: out of memory",
     "the scheduler does not catch torch.OutOfMemoryError (the few places that do print "
     "other text)"),
    ("memory_unbalanced", True, None,
     r"[\w.]*(?:Error|Exception): The memory capacity is unbalanced",
     "raised by default (SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK): the scheduler dies"),
    ("memory_unbalanced_warning", False, None, r"The memory capacity is unbalanced",
     "only logged when the balance check is turned off: start-up continues"),
    ("nccl_timeout", True, None,
     r"(?:\[[^\]]*Rank \d+\] )?(?:Watchdog caught collective operation timeout|Some NCCL "
     r"operations have failed or timed out\.|To avoid data inconsistency, we are taking the "
     r"entire process down\.)",
     "torch's NCCL watchdog aborts the process to avoid data inconsistency"),
    ("process_abort", True, None, r"terminate called after throwing an instance of",
     "C++ std::terminate: the process aborts without Python's cleanup"),
    ("nccl_error", True, None, r"[\w.:]*(?:Error|Exception): NCCL error\b|NCCL error\b",
     "raised by a collective (pynccl or torch.distributed): the rank's scheduler dies"),
    ("dist_init_timeout", True, "launching",
     r"[\w.]*DistStoreError: .*\b(?:timeout|[Tt]imed out)\b|"
     r"[\w.]*DistNetworkError: The client socket has timed out after",
     "torch.distributed's store waited out its timeout for a rank that never joined (or a "
     "rank never reached the store's host at --dist-init-addr)"),
    ("dist_store_bind_failed", True, "launching",
     r"[\w.]*DistNetworkError: The server socket has failed to listen",
     "world rank 0 cannot host torch.distributed's store on --dist-init-addr's port: the "
     "group never forms"),
    ("disk_full", True, None,
     r"[\w.]*Error: \[Errno 28\] No space left on device|\[Errno 28\] No space left|"
     r"\S+: write error: No space left on device",
     "a write failed for want of disk space: the process that wrote it fails"),
    ("watchdog_timeout", True, "starting_http",
     r"(?:Scheduler )?[Ww]atchdog timeout \((?!.*soft=True)",
     "the scheduler's hard watchdog: a forward batch hung; it SIGQUITs the server (it is "
     "made after the model worker's start-up, weights, KV cache and graphs: the server got "
     "that far)"),
    ("soft_watchdog_timeout", False, None, r"(?:\w+ )?[Ww]atchdog timeout \(.*soft=True",
     "the soft watchdogs (tokenizer, detokenizer, scheduler --soft-watchdog-timeout) only dump "
     "stacks"),
    ("child_failed", True, None,
     r"Received sigquit from a child proces|SIGQUIT received\..*one child failed",
     "the main process's SIGQUIT handler kills the whole process tree"),
    ("subprocess_exited", True, None,
     r"Scheduler or DataParallelController \d+ terminated with|"
     r"Subprocess \S+ \(pid=\d+\) crashed with exit code|Rank \d+ scheduler is dead|"
     # 0.5.23's main process, when a scheduler ends before it is ready (engine.py,
     # _scheduler_died_error): the scheduler's own death, whatever killed it, comes first.
     r"Rank \d+ scheduler died during initialization",
     "a scheduler process has ended; the server cannot serve without it"),
    ("killed", True, None,
     r"(?:Killed|已杀死)\s*$|\S+: (?:line|行) \d+: +\d+ (?:Killed|已杀死)\b",
     "a shell reports a SIGKILLed process: the kernel's OOM killer, SGLang killing its own "
     "tree after a child failed, or a kill -9 from outside"),
    ("fatal_signal", True, None,
     r"Fatal Python error: (?:Segmentation fault|Aborted|Bus error)|"
     r"(?:Segmentation fault|Aborted|Bus error|段错误|已放弃)(?: \((?:core dumped|核心已转储)\))?"
     r"\s*$|"
     r"\S+: (?:line|行) \d+: +\d+ (?:Segmentation fault|Aborted|Bus error|段错误|已放弃)",
     "a process died of a signal"),
    ("bind_failed", True, "starting_http",
     r"(?:ERROR:\s+)?\[Errno \d+\] error while attempting to bind on address",
     "uvicorn cannot listen on the port and the main process exits"),
    ("launch_exception", True, None, None,  # a traceback through the launcher's top-level frame
     "a traceback out of the launcher's top level: the main process exits"),
    ("health_check_failed", False, None, r"Health check failed",
     "/health answers 503 and marks the server unhealthy; nothing exits (the gate's own "
     "/health probe judges it)"),
    # PD (0.5.23 disaggregation/decode.py _update_handshake_waiters and the transfer poll,
    # prefill.py handle_bootstrap_failure and handle_inflight_transfer_failure; common/conn.py
    # try_ensure_parallel_info, decode.py _ensure_prefill_info).
    ("kv_transfer_failed", False, None,
     r"(?:Decode|Prefill) (?:handshake|transfer|bootstrap) failed for request rank=\d+ ",
     "one request's KV cache did not pass between prefill and decode: that request is aborted "
     "(500) and the server serves on"),
    ("kv_prefill_unreachable", False, None,
     r"Could not fetch prefill parallel info from \S+ after \d+ attempts|"
     r"Error fetching prefill (?:server )?info from bootstrap: |"
     r"Failed to get prefill server info: \d+",
     "a decode could not look up a prefill at its KV bootstrap server: the requests routed "
     "through that prefill are aborted; the decode serves on"),
    ("kv_prefill_lost", False, None,
     r"Lost connection with prefill instance \(bootstrap_addr: \S+\), \d+ requests affected",
     "a decode's heartbeat lost a prefill's KV bootstrap server (common/conn.py "
     "_handle_node_failure): the requests waiting on that prefill are aborted, the next ones "
     "look it up again; the decode serves on"),
    ("traceback", False, None, None,  # a traceback that named none of the kinds above
     "a traceback by itself is not fatal: request errors print one and the server goes on"),
)

FATAL_KINDS = frozenset(row[0] for row in FAILURES if row[1])
FAILURE_WHY = dict((row[0], row[4]) for row in FAILURES)
# The GPU's own faults: the verdict is gpu_fault, not crashed.
GPU_FAULT_KINDS = frozenset(("gpu_error",))
# Failures that follow another one (SGLang tearing its tree down after a child failed): the
# first failure that is not one of these is the cause.
CONSEQUENCE_KINDS = frozenset(("child_failed", "subprocess_exited", "killed"))
# KV transfer between a PD deployment's prefill and decode: one request's failure each, never
# the server's; counted apart from the failures (a busy decode can log thousands), each kind
# in its own counter: requests aborted, failed look-ups of a prefill, prefills a decode's
# heartbeat lost.
KV_TRANSFER_COUNTERS = {"kv_transfer_failed": "requests_failed",
                        "kv_prefill_unreachable": "lookups_failed",
                        "kv_prefill_lost": "prefills_lost"}
KV_TRANSFER_KINDS = frozenset(KV_TRANSFER_COUNTERS)
# Where such a line names the prefill: its bootstrap address (decode.py, conn.py), or the
# host and port of the requests error that failed to reach it.
_KV_PEER = re.compile(r"from (?:bootstrap_addr: )?(?P<addr>\S+?)(?: after \d+ attempts|$|,)|"
                      r"\(bootstrap_addr: (?P<lost>[^)\s]+)\)|"
                      r"host='(?P<host>[^']+)', port=(?P<port>\d+)\)")
# Faults of the node, not of the configuration (DESIGN.md "Cause"). A port that another
# program holds is the node's: two servers of one inventory on one port are refused before
# anything starts (the fleet-wide clash check), so a bind that fails at start lost the port to
# a program outside the deployment.
ENVIRONMENT_KINDS = frozenset(("disk_full", "bind_failed", "dist_store_bind_failed"))
# A scheduler's end that SGLang reports with the signal that ended it (engine.py's
# _scheduler_died_error "exit code: -9", the launcher's "crashed with exit code -9", the DP
# controller's "terminated with -9"): the signal's number.
_EXIT_SIGNAL = re.compile(r"(?:exit code:? |terminated with )-(\d+)\b")


def exit_signal(failure):
    """The signal number a consequence line says ended a scheduler, or None."""
    if failure is None or failure["kind"] != "subprocess_exited":
        return None
    m = _EXIT_SIGNAL.search(failure.get("exception") or failure["message"])
    return int(m.group(1)) if m else None

# What to try, for the kinds where SGLang's own message or source says it.
FAILURE_HINTS = {
    "capture_failed": "lower --mem-fraction-static or --cuda-graph-max-bs-decode, or disable "
                      "decode CUDA graphs (SGLang's own advice)",
    "kv_pool_too_small": "raise --mem-fraction-static (the message says above what), or free "
                         "GPU memory",
    "kv_alloc_oom": "lower --max-running-requests or --chunked-prefill-size",
    "cuda_oom": "lower --mem-fraction-static (graphs and activations need the rest)",
    "memory_unbalanced": "another process holds memory on some of the GPUs",
    "nccl_timeout": "a rank hung or the interconnect failed: the rank that failed first is "
                    "the lead",
    "nccl_error": "check the NCCL_* settings, the interconnect and every rank's first error "
                  "(NCCL_DEBUG=INFO shows it)",
    "dist_init_timeout": "a rank or node never joined: check that every node of the group "
                         "started, and that --dist-init-addr is reachable from all of them",
    "dist_store_bind_failed": "another process listens on --dist-init-addr's port on the "
                              "group's first node: free the port or choose another one "
                              "(sglang_server_dist_init_port)",
    "disk_full": "free disk space on the node (the log, the model cache, /tmp); the "
                 "configuration is not at fault",
    "gpu_error": "the GPU failed: check `nvidia-smi -q -d ECC` (or `rocm-smi`) and the kernel "
                 "log's Xid lines; reset the GPU or drain the node",
    "killed": "a SIGKILL: the kernel log says whether the OOM killer sent it (host memory); "
              "without such a line it came from outside SGLang",
    "child_failed": "a child process failed first (its error comes before this line, or went "
                    "to its own output); SGLang then killed its whole tree",
    "subprocess_exited": "a scheduler process ended without a Python error: a signal (a "
                         "negative exit code) or the kernel's OOM killer (see the kernel log)",
    "bind_failed": "another program took the port while the server loaded: stop it (the "
                   "verdict names it where the node could see it), or give the server a free "
                   "port (sglang_server_port); the configuration is not at fault",
    "watchdog_timeout": "a forward batch hung for --watchdog-timeout seconds",
}

# SGLang's request log (utils/request_logger.py): text records start with these words, JSON
# records (--log-requests-format json) are one JSON object; both quote client data.
_REQUEST_LOG = re.compile(r'(?:Receive(?: OpenAI)?: obj=|Finish: obj=|\{"timestamp": )')
# Where a request's error is logged with client data in it: a line that only names it.
_REQUEST_ERROR = re.compile(r"\[http_server\] (?:Error|Client disconnected)|"
                            r"ERROR:\s+Exception in ASGI application")
# The final line of a traceback: an exception's (qualified) type, then its message.
EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:::\w+)*)(?::\s?(?P<msg>.*))?$")
# Outside a traceback, a line that is an exception by its type's name.
_NAMED_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(?:[A-Z]\w*)?"
                              r"(?:Error|Exception|Exit|Interrupt)(?::|$)")

_COMPILED = [(kind, fatal, phase, re.compile(p)) for kind, fatal, phase, p, _ in FAILURES if p]
# One match per line first: most lines of a long log match none of the patterns.
_ANY = re.compile("|".join("(?:%s)" % row[3] for row in FAILURES if row[3]))


def is_request_log(message):
    """Whether a message is SGLang's record of a request (client data, never a failure)."""
    return bool(_REQUEST_LOG.match(message))


def is_request_error(message):
    """Whether a message announces a request's error (what follows is the request's)."""
    return bool(_REQUEST_ERROR.match(message))


def exception_message(message):
    """The message part of an exception line ('CUDA out of memory. ...' from
    'torch.OutOfMemoryError: CUDA out of memory. ...'), or None when it is not one."""
    if not _NAMED_EXCEPTION.match(message):
        return None
    m = EXCEPTION_LINE.match(message)
    return (m.group("msg") or "") if m else None


def match(message, exception_msg=None):
    """(kind, fatal, phase) of the failure a message is, or None. Anchored: the pattern must
    start the message, or the exception's message when the line is an exception."""
    texts = [message] if exception_msg is None else [message, exception_msg]
    if not any(_ANY.match(text) for text in texts):
        return None
    for kind, fatal, phase, pattern in _COMPILED:
        for text in texts:
            if pattern.match(text):
                return kind, fatal, phase
    return None


# ---- one failure, said once ---------------------------------------------------------------

_DIGITS = re.compile(r"\d+")
_RANK_FIELDS = re.compile(r"^([A-Za-z_]*?)(\d+)$")


def fold(failures):
    """Failures with the same kind and text (numbers aside: each rank names its own GPU; an
    exception's type aside: SGLang logs some messages and then raises them) said once, at
    their first line, with every rank that printed them and how many times."""
    groups = []
    index = {}
    for f in failures:
        text = f.get("exception") or f["message"]
        # A message SGLang logs and then raises reads the same with the exception's type.
        text = exception_message(text) or text
        key = (f["kind"], f["fatal"], _DIGITS.sub("N", text.strip()))
        if key not in index:
            index[key] = len(groups)
            group = dict(f)
            group.update(ranks=[], count=0)
            groups.append(group)
        group = groups[index[key]]
        group["count"] += 1
        if f.get("rank") and f["rank"] not in group["ranks"]:
            group["ranks"].append(f["rank"])
    return groups


def kv_peer(message):
    """The prefill's bootstrap address ('10.0.0.5:8998') a KV transfer line names, or None."""
    m = _KV_PEER.search(message)
    if m is None:
        return None
    return m.group("addr") or m.group("lost") or "%s:%s" % (m.group("host"), m.group("port"))


def ranks_text(ranks):
    """'TP0-7', 'DP1 TP0', 'TP0,2,5', 'DP0-7 TP0' from the ranks' log prefixes."""
    if not ranks:
        return ""
    split = [r.split() for r in ranks]
    if len(set(len(s) for s in split)) != 1:
        return ",".join(ranks)
    out = []
    for i in range(len(split[0])):
        column = [s[i] for s in split]
        if len(set(column)) == 1:
            out.append(column[0])
            continue
        parts = [_RANK_FIELDS.match(c) for c in column]
        names = set(p.group(1) for p in parts if p)
        if None in parts or len(names) != 1:
            return ",".join(ranks)
        out.append(names.pop() + _numbers_text(sorted(set(int(p.group(2)) for p in parts))))
    return " ".join(out)


def _numbers_text(numbers):
    runs, start = [], numbers[0]
    for i, prev in enumerate(numbers):
        cur = numbers[i + 1] if i + 1 < len(numbers) else None
        if cur != prev + 1:
            runs.append(str(start) if start == prev else "%d-%d" % (start, prev))
            start = cur
    return ",".join(runs)


def cause(failures):
    """The failure that ended the server: the first fatal one that is not a consequence of
    another (SGLang killing its tree after a child failed), else the first fatal one."""
    fatal = [f for f in failures if f["fatal"]]
    for f in fatal:
        if f["kind"] not in CONSEQUENCE_KINDS:
            return f
    return fatal[0] if fatal else None


def where(failure):
    """'log line 212', or 'line 12 of this run' when the log was read from where the run
    began, or 'line 3 of the part read after the gap' after a bounded read's gap."""
    if failure.get("line_no") is None:
        return ""
    lines_from = failure.get("lines_from") or "file"
    if lines_from == "file":
        return "log line %d" % failure["line_no"]
    return "line %d of %s" % (failure["line_no"], lines_from)


def said(failure):
    """One failure in one line: 'TP0-7: KeyError: 'x' (log line 212)'."""
    text = failure.get("exception") or failure["message"]
    if failure.get("chain_began_with"):
        text += " (the chain began with: %s)" % failure["chain_began_with"]
    if failure.get("exception") is None and failure.get("traceback"):
        text += " (its traceback has no final line yet)"
    ranks = ranks_text(failure.get("ranks") or ([failure["rank"]] if failure.get("rank")
                                                 else []))
    at = where(failure)
    return "%s%s%s" % (ranks + ": " if ranks else "", text, " (%s)" % at if at else "")


# torch's OutOfMemoryError message: what the GPU holds, what was asked.
_OOM_NUMBERS = re.compile(
    r"Tried to allocate (?P<asked>[\d.]+ [GMK]iB)\. GPU (?P<gpu>\d+) has a total capacity of "
    r"(?P<total>[\d.]+ [GMK]iB) of which (?P<free>[\d.]+ [GMK]iB) is free\.")
_OOM_LOADED = re.compile(r"Of the allocated memory (?P<torch>[\d.]+ [GMK]iB) is allocated by "
                         r"PyTorch")


def hint(failure, phase):
    """What to do about one failure, from what the log shows around it."""
    kind = failure["kind"]
    if kind == "cuda_oom" and phase == "loading_weights":
        return _weights_do_not_fit(failure)
    if kind == "killed" and failure.get("after_sglang_failure"):
        return ("SGLang killed its own process tree after a child failed (the shell prints "
                "Killed): the child's error above is the cause, not the OOM killer")
    return FAILURE_HINTS.get(kind)


def _weights_do_not_fit(failure):
    text = failure.get("exception") or failure["message"]
    m = _OOM_NUMBERS.search(text)
    numbers = ""
    if m:
        held = _OOM_LOADED.search(text)
        loaded = (", with %s already loaded" % held.group("torch")) if held else ""
        numbers = (": GPU %s has %s in all, %s free%s, and loading asked for %s more"
                   % (m.group("gpu"), m.group("total"), m.group("free"), loaded,
                      m.group("asked")))
    return ("the weights do not fit on the GPUs%s. Spread them over more GPUs (a larger "
            "--tp-size), use a quantized checkpoint, or use GPUs with more memory; "
            "--mem-fraction-static does not help (the KV cache comes after the weights)"
            % numbers)
