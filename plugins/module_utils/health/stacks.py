# -*- coding: utf-8 -*-
# Each rank's Python stack, sampled with py-spy while a server starts and while it serves, and
# the hang signatures read from it. A hung server's stacks stop changing while nothing
# progresses; the classifier calls that `stalled` long before a phase's window runs out (the
# window stays as the backstop for hangs whose stacks move). Sampling is py-spy's non-blocking
# mode (it never pauses the rank), at a low rate, with a CPU budget per observation.
# The signatures are SGLang's own frames; each row names the file of the pinned release (0.5.23,
# and 0.5.4.post3 where the layout differs) it comes from. docs/health-gate.md shows the table.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import resource
import subprocess
import time

from ..common.text import inert

# How often one rank is sampled at most, how many samples per rank the gate state keeps, and how
# long the stacks must stay on the same frames with no progress before the gate says stalled.
SAMPLE_INTERVAL_S = 10.0
DUE_EARLY = 0.75
SAMPLES_KEPT = 4
FROZEN_SAMPLES = 3
STACK_WINDOW_S = 30.0
# Why sampling is off when the operator turned it off: said in the verdict, never warned, and
# forgotten once it is turned on again.
TURNED_OFF = "turned off (stack_sampling: false)"
# One observation spends at most this long sampling, with this many dumps side by side (the
# longest-unsampled ranks first; the others are due at the next observation).
SAMPLING_BUDGET_S = 3.0
PARALLEL_DUMPS = 16
FRAMES_KEPT = 12

# Processes that compile kernels for a JIT (DeepGEMM and FlashInfer through NVCC and ninja,
# Triton through ptxas): while one runs under a rank, the rank is working, whatever its stack.
COMPILERS = frozenset(("nvcc", "cicc", "ptxas", "nvlink", "fatbinary", "ninja", "cc1plus",
                       "cc1", "gcc", "g++", "c++", "cc", "clang", "clang++", "ld", "as"))

WAITING = "waiting"  # a rank that waits for another: it points at the one stuck elsewhere
STUCK = "stuck"


class Signature(object):
    """One row of the signature table: the frames that mark it, each (file suffix, function
    names or None for any, the release whose file it is), which are also its sources."""

    def __init__(self, key, words, kind, frames, refines=None):
        self.key, self.words, self.kind = key, words, kind
        self.frames = frames
        self.refines = refines  # a signature this one names more precisely when found outside

    def matches(self, frame):
        for suffix, names, _ in self.frames:
            if frame["file"].endswith(suffix) and (names is None or frame["function"] in names):
                return True
        return False

    @property
    def source(self):
        """'srt/model_loader/weight_utils.py (_load_file, ...) [0.5.23]; ...'."""
        return "; ".join("%s%s [%s]" % (suffix, " (%s)" % ", ".join(sorted(names)) if names
                                        else "", release)
                         for suffix, names, release in self.frames)


SGLANG = "SGLang 0.5.23"
OLD_SGLANG = "SGLang 0.5.4.post3"
TORCH = "torch 2.14.1"


def _names(*names):
    return frozenset(names)


SIGNATURES = (
    Signature("cuda_graph_capture", "CUDA graph capture", STUCK, (
        ("srt/model_executor/runner/decode_cuda_graph_runner.py",
         _names("capture_one_shape", "_capture_one_stream", "capture"), SGLANG),
        ("srt/model_executor/runner/prefill_cuda_graph_runner.py",
         _names("capture_one_shape", "_capture_one_stream", "capture"), SGLANG),
        ("srt/model_executor/runner_backend/full_cuda_graph_backend.py", _names("capture_one"),
         SGLANG),
        ("srt/model_executor/runner_backend/breakable_cuda_graph_backend.py",
         _names("capture_one"), SGLANG),
        ("srt/distributed/device_communicators/custom_all_reduce.py",
         _names("capture", "register_graph_buffers"), SGLANG),
        ("srt/model_executor/cuda_graph_runner.py", _names("capture_one_batch_size", "capture"),
         OLD_SGLANG),
    )),
    Signature("nccl_collective", "a NCCL collective", WAITING, (
        ("srt/distributed/parallel_state.py",
         _names("all_reduce", "barrier", "broadcast", "broadcast_object",
                "broadcast_object_list", "all_gather", "all_gather_into_tensor",
                "reduce_scatter", "reduce_scatter_tensor", "_all_reduce_out_place",
                "_all_reduce_in_place", "send", "recv"), SGLANG),
        ("srt/distributed/device_communicators/pynccl.py", None, SGLANG),
        ("torch/distributed/distributed_c10d.py",
         _names("all_reduce", "barrier", "broadcast", "all_gather", "all_gather_into_tensor",
                "reduce_scatter_tensor", "broadcast_object_list", "monitored_barrier", "send",
                "recv", "all_to_all_single"), TORCH),
    )),
    Signature("scheduler_peer_wait", "a scheduler waiting on a peer rank", WAITING, (
        ("srt/managers/scheduler_components/request_receiver.py",
         _names("recv_requests", "_broadcast_reqs_across_ranks"), SGLANG),
        ("srt/utils/common.py", _names("broadcast_pyobj"), SGLANG),
    ), refines="nccl_collective"),
    Signature("weight_io", "weight I/O (safetensors reads)", STUCK, (
        ("srt/model_loader/weight_utils.py",
         _names("safetensors_weights_iterator",
                "buffered_multi_thread_safetensors_weights_iterator", "_load_file",
                "pt_weights_iterator", "multi_thread_pt_weights_iterator"), SGLANG),
        ("safetensors/torch.py", _names("load_file", "load"), "safetensors"),
    )),
    Signature("jit_compilation", "JIT compilation (DeepGEMM, FlashInfer, Triton)", STUCK, (
        ("srt/layers/deep_gemm_wrapper/compile_utils.py",
         _names("_compile_deep_gemm_one_type_all", "_maybe_compile_deep_gemm_one_type_all"),
         SGLANG),
        ("flashinfer/jit/cpp_ext.py", None, "flashinfer"),
        ("flashinfer/jit/core.py", None, "flashinfer"),
        ("triton/compiler/compiler.py", _names("compile"), "triton"),
        ("torch/utils/cpp_extension.py", _names("load", "_jit_compile"), TORCH),
    )),
    Signature("detokenizer_deadlock", "a tokenizer or detokenizer deadlock", STUCK, (
        ("srt/managers/detokenizer_manager.py",
         _names("handle_batch_token_id_out", "_decode_batch_token_id_output",
                "handle_batch_embedding_out"), SGLANG),
        ("srt/managers/tokenizer_manager.py", _names("_handle_batch_output", "handle_loop"),
         SGLANG),
    )),
)
SIGNATURE_KEYS = tuple(s.key for s in SIGNATURES)
_BY_KEY = dict((s.key, s) for s in SIGNATURES)


def signature_of(frames):
    """(signature, the frame that marks it) of one stack, innermost frame first, or (None,
    None). The innermost marked frame decides (a rank waiting in all_reduce inside graph
    capture waits in a collective), unless a row that refines it is found further out (a
    broadcast inside recv_requests is a scheduler waiting on its peer)."""
    found = None
    for frame in frames:
        for sig in SIGNATURES:
            if not sig.matches(frame):
                continue
            if found is None:
                found = (sig, frame)
            elif sig.refines == found[0].key:
                return sig, frame
    return found or (None, None)


def _short(frame):
    return "%s (%s:%s)" % (frame["function"], frame["file"], frame.get("line"))


def stack_key(frames):
    """What 'the same frames' means: functions and files, not lines (a busy-wait loop moves
    between the lines of one function)."""
    return "|".join("%s@%s" % (f["function"], f["file"]) for f in frames)


# ---- sampling ---------------------------------------------------------------------------


def find_py_spy(configured="", server_python=""):
    """py-spy: the configured path, else beside the server's Python (SGLang's venv holds it),
    else on PATH; None when none is found."""
    candidates = [configured] if configured else []
    if server_python and os.path.isabs(server_python):
        candidates.append(os.path.join(os.path.dirname(server_python), "py-spy"))
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidates.append(os.path.join(folder, "py-spy"))
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


class SamplingUnavailable(Exception):
    """py-spy cannot read this node's processes (missing, or ptrace denied)."""


_DENIED = re.compile(r"Permission denied|Operation not permitted|ptrace", re.I)


def _frame(raw, secrets):
    name = raw.get("name") or "?"
    # The package-relative name (sglang/srt/...): what a reader knows, and shorter to keep.
    path = raw.get("short_filename") or raw.get("filename") or "?"
    text = inert("%s\n%s" % (name.rsplit(".", 1)[-1], path), keep_newlines=True)
    for secret in secrets:
        text = text.replace(secret, "********")
    function, _, file_ = text.partition("\n")
    return {"function": function, "file": file_, "line": raw.get("line")}


def _main_thread(threads):
    """The thread that runs the rank's work: MainThread, else the first active one."""
    for thread in threads:
        if thread.get("thread_name") == "MainThread":
            return thread
    active = [t for t in threads if t.get("active")]
    return (active or threads or [{}])[0]


def start_dump(py_spy, pid):
    """py-spy's non-blocking dump of `pid` as JSON, started (several run side by side, so that
    one observation takes one dump's time, not one per rank)."""
    try:
        return subprocess.Popen([py_spy, "dump", "--nonblocking", "--json", "--pid", str(pid)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        raise SamplingUnavailable("py-spy could not run: %s" % exc) from exc


def finish_dump(proc, pid, deadline, secrets=()):
    """The started dump's frames of `pid`'s main thread, innermost first, each masked like a
    log line (control characters made inert, the process's secret values blanked). Raises
    SamplingUnavailable when ptrace is denied; None when the process is gone, is not Python,
    or the dump outlasted `deadline` (it is then killed)."""
    try:
        out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None
    if proc.returncode != 0:
        err = err.decode("utf-8", "replace")
        if _DENIED.search(err) and os.path.exists("/proc/%d" % pid):
            raise SamplingUnavailable("py-spy was denied ptrace of pid %d (%s)" % (
                pid, inert(err.strip().splitlines()[0] if err.strip() else "", False)[:200]))
        return None
    try:
        threads = json.loads(out.decode("utf-8", "replace"))
    except ValueError:
        return None
    thread = _main_thread(threads if isinstance(threads, list) else [])
    frames = [_frame(f, secrets) for f in thread.get("frames") or []]
    return frames[:FRAMES_KEPT] if frames else None


def rank_label(cmdline):
    """A process's name in the verdict: its SGLang title (sglang::scheduler_TP3 -> TP3), or
    'main' for the launcher."""
    title = (cmdline or "").split(" ", 1)[0]
    if title.startswith("sglang::scheduler"):
        return title[len("sglang::scheduler"):].lstrip("_").replace("_", " ") or "scheduler"
    if title.startswith("sglang::"):
        return title[len("sglang::"):]
    return "main"


def is_python(pid):
    """Whether a process runs a Python interpreter (py-spy reads only those: a dump of the
    launch script's /bin/sh is a native backtrace that says nothing)."""
    try:
        exe = os.path.basename(os.readlink("/proc/%d/exe" % pid))
    except OSError:
        return False
    return bool(re.match(r"^python(?:\d+(?:\.\d+)?)?(?: \(deleted\))?$", exe))


def is_compiler(cmdline):
    first = (cmdline or "").split(" ", 1)[0]
    return os.path.basename(first) in COMPILERS


def sample_ranks(py_spy, members, last_sampled, now, interval=SAMPLE_INTERVAL_S,
                 budget=SAMPLING_BUDGET_S, secrets_of=None):
    """Sample the Python members (schedulers, detokenizer, launcher) not sampled for
    `interval` s, side by side, the longest unsampled first, within `budget` s. Returns
    (samples by label, cost: {"samples", "cpu_s", "wall_s"}). `last_sampled`: label -> the
    wall time of its last sample (from the gate state); `secrets_of(pid)`: the values to
    blank in its frames."""
    # Due a little early too: observations come on the poll's cadence, each sampling at a
    # different point of its run, and a strict interval would skip every other poll.
    due = [m for m in members if not is_compiler(m.get("cmdline")) and is_python(m["pid"])
           and now - (last_sampled or {}).get(rank_label(m.get("cmdline")), 0)
           >= interval * DUE_EARLY]
    due.sort(key=lambda m: (last_sampled or {}).get(rank_label(m.get("cmdline")), 0))
    began, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    deadline = began + budget
    running = [(member, start_dump(py_spy, member["pid"])) for member in due[:PARALLEL_DUMPS]]
    out, denied = {}, None
    for member, proc in running:
        try:
            frames = finish_dump(proc, member["pid"], deadline,
                                 secrets_of(member["pid"]) if secrets_of else ())
        except SamplingUnavailable as exc:
            denied, frames = exc, None  # the others are still collected, then it is said
        if frames:
            out[rank_label(member.get("cmdline"))] = {"pid": member["pid"], "at": now,
                                                      "frames": frames}
    if denied is not None and not out:
        raise denied
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out, {"samples": len(out), "cpu_s": round(cpu, 4),
                 "wall_s": round(time.monotonic() - began, 4)}


# ---- judging ----------------------------------------------------------------------------


def merge(history, samples, now, wall=None):
    """The per-rank history the gate state keeps: the last SAMPLES_KEPT samples per rank (a
    new pid under a label starts over), each as its key, its frames and when it was taken on
    the classifier's clock (`now`) and the wall clock (`wall`)."""
    history = dict(history or {})
    for label, sample in (samples or {}).items():
        kept = [s for s in history.get(label) or [] if s.get("pid") == sample["pid"]]
        kept.append({"pid": sample["pid"], "at": now, "wall": wall,
                     "key": stack_key(sample["frames"]), "frames": sample["frames"]})
        history[label] = kept[-SAMPLES_KEPT:]
    return history


def frozen(history, labels, since, samples=FROZEN_SAMPLES, clock="at"):
    """Whether every rank in `labels` has at least `samples` samples taken since `since` (the
    last progress) and all on the same frames. `clock`: "at" (the classifier's) or "wall"."""
    if not labels:
        return False
    for label in labels:
        recent = [s for s in history.get(label) or [] if (s.get(clock) or 0) >= since]
        if len(recent) < samples or len(set(s["key"] for s in recent)) != 1:
            return False
    return True


def _rank_order(label):
    numbers = [int(n) for n in re.findall(r"\d+", label)]
    return (0 if label not in ("detokenizer", "main") else 1, numbers, label)


def read_signature(history, labels):
    """The hang's signature from each rank's latest frames: {"signature", "words", "rank",
    "frame", "source", "ranks": {label: signature key or None}, "waiting": [labels],
    "text"}. A rank stuck elsewhere is named over the ranks that wait for it in a collective;
    with none stuck elsewhere, the first waiting rank is named."""
    per_rank = {}
    for label in sorted(labels, key=_rank_order):
        latest = (history.get(label) or [None])[-1]
        if latest is None:
            continue
        sig, frame = signature_of(latest["frames"])
        per_rank[label] = (sig, frame or latest["frames"][0])
    stuck = [(lb, s, f) for lb, (s, f) in per_rank.items() if s is not None and s.kind == STUCK]
    waiting = [lb for lb, (s, _) in per_rank.items() if s is not None and s.kind == WAITING]
    named = [(lb, s, f) for lb, (s, f) in per_rank.items() if s is not None]
    if stuck:
        rank, sig, frame = stuck[0]
    elif named:
        rank, sig, frame = named[0]
    else:
        rank = next(iter(per_rank), None)
        sig, frame = None, per_rank[rank][1] if rank else None
    out = {"signature": sig.key if sig else None, "words": sig.words if sig else
           "no known signature", "rank": rank, "frame": _short(frame) if frame else None,
           "source": sig.source if sig else None,
           "ranks": dict((lb, s.key if s else None) for lb, (s, _) in per_rank.items()),
           "waiting": [lb for lb in waiting if lb != rank]}
    text = "%s at %s on %s" % (out["words"], out["frame"], rank)
    if out["waiting"]:
        text += "; %s wait%s for it in %s" % (
            ", ".join(out["waiting"]), "s" if len(out["waiting"]) == 1 else "",
            " and ".join(sorted(set(_BY_KEY[per_rank[lb][0].key].words
                                    for lb in out["waiting"]))))
    out["text"] = text
    return out
