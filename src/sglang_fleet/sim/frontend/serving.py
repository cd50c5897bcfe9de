"""The simulated tokenizer manager: request routing, paced generation, the batch log lines.

Decode speed comes from the simulator profile and is SIMULATED; everything around it follows
SGLang 0.5.23: server status (Starting / Up / UnHealthy), the radix prefix cache behind
`cached_tokens`, round-robin routing over data-parallel replicas
(managers/data_parallel_controller.py round_robin_scheduler, dispatch_health_check), the
`meta_info` fields of managers/tokenizer_manager.py _handle_batch_output and
observability/req_time_stats.py, and the `Prefill batch, ...` / `Decode batch, ...` lines of
managers/scheduler_components/metrics_reporter.py (report_prefill_stats, report_decode_stats;
decode lines every --decode-log-interval decode steps, 40 by default).
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sglang_fleet.known.sim_regress import ABORT, ERROR
from sglang_fleet.sim.engine.runtime import SimRuntime, log
from sglang_fleet.sim.frontend import logprobs, metrics
from sglang_fleet.sim.frontend.control import Hub
from sglang_fleet.sim.frontend.weight_export import WeightExporter
from sglang_fleet.sim.pd.kv_receiver import PrefillInfoTable
from sglang_fleet.sim.pd.kv_sender import KVSender

STARTING, UP, UNHEALTHY = "Starting", "Up", "UnHealthy"


@dataclass
class Replica:
    """One data-parallel replica's schedulers, as the main process routes to them."""

    dp_rank: int | None
    prefix: str  # the stats-logging scheduler's log prefix (its TP rank 0)
    pids: list[int] = field(default_factory=list)
    # The scheduler's admission (scheduler.py _abort_on_queued_limit, the running batch's
    # limit): requests running, and the ids of those waiting for a place.
    running: int = 0
    waiting: collections.deque = field(default_factory=collections.deque)


class Aborted(Exception):
    """The scheduler aborted the request before any output with an HTTP status
    (FINISH_ABORT(message, status)): tokenizer_manager._handle_abort_finish_reason raises it as
    an HTTPException, or a stream yields it."""

    status = 500
    message = "Aborted"

    def __init__(self) -> None:
        super().__init__(self.message)


class QueueFull(Aborted):
    """scheduler.py _abort_on_queued_limit: the waiting queue is at --max-queued-requests; the
    request is aborted with 503 and this message."""

    status = 503
    message = "The request queue is full."


class InternalError(Aborted):
    """SGLANG_SIM_REGRESS errors=P: an internal error aborts the request with 500, as
    FINISH_ABORT(..., HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError") does."""

    message = "Internal error (simulated: SGLANG_SIM_REGRESS errors)"


# tokenizer_manager.abort_request's abort of a running request (no message): the scheduler
# finishes it with FINISH_ABORT().to_json(), and the client gets its output so far with a 200.
ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
# SGLANG_FORCE_STREAM_INTERVAL's default: a non-streaming request's outputs reach the tokenizer
# manager every this many tokens (output_streamer.py), and only there is its ITL observed.
FORCE_STREAM_INTERVAL = 50


def token_text(i: int) -> str:
    return f" tok{i}"


class ServerState:
    """What the HTTP handlers read and the generations update; one lock guards it."""

    def __init__(self, rt: SimRuntime, replicas: list[Replica], hub: Hub):
        self.rt = rt
        self.replicas = replicas
        self.hub = hub
        self.max_running = int(getattr(rt.args, "max_running_requests", None) or 2048)
        queued = getattr(rt.args, "max_queued_requests", None)
        self.max_queued = None if queued is None else int(queued)
        self.admission = threading.Condition()
        # What /server_info reports besides the arguments (set by the engine at start-up).
        self.scheduler_info: dict[str, Any] = {}
        self.startup_time: dict[str, Any] = {}
        self.launch_command = ""
        self.replica_state: dict[Any, dict[str, Any]] = {}  # each DP rank's internal state
        # A decode's table of the prefills it has looked up (set by the engine in PD mode).
        self.prefill_info: PrefillInfoTable | None = None
        # A seed's weight-send groups (remote-instance loading of another server).
        self.weight_exporter = WeightExporter(rt)
        # A prefill's side of the KV transfer (kv_sender): the rooms its decodes bootstrapped
        # and those whose KV cache it sent.
        self.kv_sender: KVSender | None = None
        self.stats = metrics.RequestStats()
        self.detokenizer_pid: int | None = None
        self.detokenizer_hung = False  # the detokenizer_hang fault struck: no output comes
        self.status = STARTING
        self.gracefully_exit = False
        self.lock = threading.Lock()
        self.running: dict[str, Generation] = {}
        self.generated_tokens = 0
        self.last_gen_throughput = 0.0
        self.last_receive_tstamp = 0.0
        self.health_timeout = int(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        # SIGUSR1's switch: the schedulers' batches hang (and end again on the next one).
        self.hang_generation = False
        self.stop_event = threading.Event()
        self.round_robin = 0
        self.generation_requests = 0  # what SGLANG_SIM_REGRESS errors/aborts count
        self.health_round_robin = 0
        self.cache: set[tuple[Any, ...]] = set()
        self.radix_cache = not getattr(rt.args, "disable_radix_cache", False)
        self.max_total_tokens = rt.kv_tokens()
        self.decode_steps = 0
        self.decode_log_interval = int(getattr(rt.args, "decode_log_interval", 40) or 40)
        self.tokens_since_log = 0
        self.last_decode_log = time.perf_counter()
        self.last_prefill_log = time.perf_counter()
        self.cuda_graph = rt.capture_plan()
        self.tokenizer_stalled = False
        # Chunked prefill: a prompt's uncached tokens beyond --chunked-prefill-size are
        # prefilled chunk by chunk, each at the profile's prefill speed (SIMULATED) on the
        # simulator's clock (SGLANG_SIM_TIME_FACTOR, as the phases); /health waits for the
        # chunk under way.
        self.chunk_size = int(self.cuda_graph.chunked_prefill_size or 0)
        self.prefill_tok_s = float(rt.profile.get("prefill_tok_s") or 0)
        self.chunks = threading.Condition()
        self.chunking = 0  # chunked prefills under way
        self.chunk_count = 0
        # The first request (the warm-up) pays the profile's warming_up time on top of TTFT.
        self.warmup_delay = rt.duration("warming_up")

    def take_warmup_delay(self) -> float:
        with self.lock:
            delay, self.warmup_delay = self.warmup_delay, 0.0
        return delay

    # --- status (tokenizer_manager.is_healthy / is_ready) -----------------------------------
    def is_healthy(self) -> bool:
        return not self.gracefully_exit and self.status == UP

    def is_ready(self) -> bool:
        return self.is_healthy()

    # --- routing -------------------------------------------------------------------------
    def route(self, health: bool = False) -> Replica:
        with self.lock:
            if health:
                n, self.health_round_robin = self.health_round_robin, self.health_round_robin + 1
            else:
                n, self.round_robin = self.round_robin, self.round_robin + 1
        return self.replicas[n % len(self.replicas)]

    def regression_outcome(self) -> str | None:
        """What SGLANG_SIM_REGRESS does to the next generation request (regress.outcome)."""
        if self.status == STARTING:
            return None  # the warm-up is never struck: the server would not start
        with self.lock:
            self.generation_requests += 1
            n = self.generation_requests
        return self.rt.regress.outcome(n)

    # --- the schedulers' side ------------------------------------------------------------
    def admit(self, replica: Replica, ident: str) -> None:
        """Wait for a place in the replica's running batch; raise QueueFull when the waiting
        queue is at --max-queued-requests (the check counts the waiting requests only). A
        rejection is not an abort in /metrics: SGLang counts only the aborts its tokenizer
        manager sends (tokenizer_manager.abort_request: client disconnects, /abort_request)."""
        with self.admission:
            if replica.running < self.max_running and not replica.waiting:
                replica.running += 1
                return
            if self.max_queued is not None and len(replica.waiting) + 1 > self.max_queued:
                raise QueueFull
            replica.waiting.append(ident)
            while replica.waiting[0] != ident or replica.running >= self.max_running:
                self.admission.wait()
            replica.waiting.popleft()
            replica.running += 1
            self.admission.notify_all()

    def release(self, replica: Replica) -> None:
        with self.admission:
            replica.running -= 1
            self.admission.notify_all()

    def health_generation(self, gen: Generation) -> None:
        """/health's one-token request. Any output counts, an abort's too: a full queue's
        503 still reaches the tokenizer manager, which is alive."""
        if self.wait_for_a_chunk():
            return
        try:
            for _ in gen.run(lambda g: self.log_prefill([g])):
                pass
        except QueueFull:
            with self.lock:
                self.last_receive_tstamp = time.time()

    def metrics_text(self) -> str:
        """/metrics: each DP rank's scheduler gauges (its stats-logging rank's labels) and the
        tokenizer manager's request counts. Read from the main process's own counts: no
        scheduler is asked, so a stuck one does not hang it (SGLang's come from its
        processes' files)."""
        out, args = metrics.Exposition(), self.rt.args
        with self.lock:
            running = list(self.running.values())
            stats = self.stats
            for replica in self.replicas:
                self._replica_metrics(out, replica, running)
            stats.write(out, metrics.tokenizer_labels(args))
            for phase in ("load_weight", "kv_cache_allocation", "scheduler_e2e",
                          "tokenizer_e2e"):
                if phase in self.startup_time:
                    out.add("sglang:startup_time_seconds",
                            {**metrics.tokenizer_labels(args), "phase": phase},
                            self.startup_time[phase])
        return out.text()

    def _replica_metrics(self, out: metrics.Exposition, replica: Replica,
                         running: list[Generation]) -> None:
        rank = self.rt.topology.stats_rank(replica.dp_rank)
        labels = metrics.scheduler_labels(self.rt.args, rank.pp_rank, rank.tp_rank,
                                          rank.ep_rank, replica.dp_rank)
        mine = [g for g in running if g.replica is replica]
        used = sum(g.context_tokens() for g in mine)
        total = len(running) or 1
        memory = (self.replica_state.get(replica.dp_rank) or {}).get("memory_usage") or {}
        prompt = sum(v for (n, _), v in self.stats.counters.items()
                     if n == "sglang:prompt_tokens_total")
        cached = self.stats.counters.get(("sglang:cached_tokens_total", "device"), 0.0)
        bs = max(self.cuda_graph.decode_sizes or [0]) if self.cuda_graph.decode else 0
        values = {
            "sglang:num_running_reqs": replica.running,
            "sglang:num_queue_reqs": len(replica.waiting),
            "sglang:num_grammar_queue_reqs": 0,
            "sglang:gen_throughput": self.last_gen_throughput * len(mine) / total,
            "sglang:cache_hit_rate": cached / prompt if prompt else 0.0,
            "sglang:token_usage": used / self.max_total_tokens,
            "sglang:num_used_tokens": used,
            "sglang:kv_available_tokens": self.max_total_tokens - used,
            "sglang:kv_used_tokens": used,
            "sglang:num_retracted_reqs": 0,
            "sglang:num_paused_reqs": 0,
            "sglang:is_cuda_graph": 1.0 if mine and len(mine) <= bs else 0.0,
            "sglang:max_total_num_tokens": self.max_total_tokens,
            "sglang:weight_memory_usage_gb": memory.get("weight", 0.0),
            "sglang:kv_cache_memory_usage_gb": memory.get("kvcache", 0.0),
            "sglang:context_len": self.rt.context_len(),
            "sglang:startup_available_gpu_memory_gb": memory.get("startup_available", 0.0),
        }
        for name, value in values.items():
            out.add(name, labels, value)
        for phase, gb in (memory.get("graph") or {}).items():
            out.add("sglang:graph_memory_usage_gb", {**labels, "phase": phase}, gb)

    def queued(self) -> int:
        return sum(len(r.waiting) for r in self.replicas)

    def toggle_hang(self) -> None:
        """SIGUSR1: the schedulers' batches hang from now on (the running ones included), or
        end their hang."""
        self.hang_generation = not self.hang_generation
        for replica in self.replicas:
            if self.hang_generation:
                self.hub.tell(replica.pids, "stick now" if replica.running else "stick")
            else:
                self.hub.tell(replica.pids, "unstick")

    def scheduler_stopped(self, replica: Replica) -> bool:
        """A scheduler of the replica is stopped or stuck: its tokens stop coming."""
        return self.hang_generation or self.hub.frozen(replica.pids)

    def fail_detokenizer(self, hang: bool = False) -> None:
        """The detokenizer_crash fault: the detokenizer fails on this batch's output; with
        `hang` (detokenizer_hang), it deadlocks on it and no output reaches this process
        again."""
        with self.lock:
            pid, self.detokenizer_pid = self.detokenizer_pid, None
            if hang:
                self.detokenizer_hung = True
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR2 if hang else signal.SIGUSR1)

    def stall_tokenizer(self) -> None:
        """The tokenizer manager's loop stops; its soft watchdog (utils/watchdog.py) says so
        after --soft-watchdog-timeout and nothing else happens (soft: no kill)."""
        with self.lock:
            if self.tokenizer_stalled:
                return
            self.tokenizer_stalled = True
        timeout = getattr(self.rt.args, "soft_watchdog_timeout", None)

        def bark() -> None:
            time.sleep(timeout)
            log(f"TokenizerManager watchdog timeout (self.watchdog_timeout={timeout!r}, "
                f"self.soft=True)")
            print(flush=True)

        threading.Thread(target=bark, daemon=True).start()

    # --- the radix cache ---------------------------------------------------------------------
    def cached_prefix(self, key: tuple[Any, ...]) -> int:
        if not self.radix_cache or not key:
            return 0
        best = 0
        with self.lock:
            for seq in self.cache:
                n = 0
                for a, b in zip(seq, key, strict=False):
                    if a != b:
                        break
                    n += 1
                best = max(best, n)
        return min(best, len(key) - 1)  # the last token is always computed

    def insert(self, key: tuple[Any, ...]) -> None:
        if self.radix_cache and key:
            with self.lock:
                self.cache.add(key)

    def flush_cache(self, prefix: str) -> bool:
        """FlushCacheReqInput goes through the schedulers (no timeout: a stuck one hangs it);
        they refuse while requests run or wait."""
        for replica in self.replicas:
            self.hub.ask(replica.pids, "flush_cache")
        with self.lock:
            busy = bool(self.running)
            if not busy:
                self.cache.clear()
        if busy:
            log(f"Cache not flushed because there are pending requests. #queue-req: "
                f"{self.queued()}, "
                f"#running-req: {len(self.running)}", prefix)
            return False
        log("Cache flushed successfully!", prefix)
        return True

    # --- the scheduler's batch lines ------------------------------------------------------
    def log_prefill(self, gens: list[Generation], chunk: int | None = None,
                    pending: int = 0) -> None:
        """metrics_reporter.report_prefill_stats, after a prefill batch's forward: each
        request's tokens of this batch (a chunked one's chunk; a continuing chunk has no
        cached tokens) and the tokens of the chunked request still to come."""
        now = time.perf_counter()
        with self.lock:
            gap, self.last_prefill_log = now - self.last_prefill_log, now
            running = len(self.running) - len(gens)
            used = sum(g.context_tokens() for g in self.running.values())
        new_tokens = chunk if chunk is not None else sum(g.chunk_tokens() for g in gens)
        graph = self.cuda_graph.prefill and new_tokens <= max(self.cuda_graph.prefill_sizes or [0])
        log(f"Prefill batch, #new-seq: {len(gens)}, #new-token: {new_tokens}, "
            f"#cached-token: {sum(0 if g.prefilled else g.cached_tokens for g in gens)}, "
            f"token usage: {used / self.max_total_tokens:.2f}, #running-req: {max(running, 0)}, "
            f"#queue-req: {self.queued()}, #pending-token: {pending}, cuda graph: {graph}, "
            f"input throughput (token/s): {new_tokens / gap if gap > 0 else 0.0:.2f}",
            gens[0].replica.prefix)

    def chunk_ended(self) -> None:
        with self.chunks:
            self.chunk_count += 1
            self.chunks.notify_all()

    def wait_for_a_chunk(self) -> bool:
        """While a chunked prefill runs the scheduler is not idle: /health's request is not
        run but answered after the batch under way (scheduler.py
        maybe_send_health_check_signal). Waits for that batch's end; False when none runs."""
        with self.chunks:
            if not self.chunking:
                return False
            seen = self.chunk_count
            while self.chunk_count == seen and self.chunking and not self.stop_event.is_set():
                self.chunks.wait(0.5)
        with self.lock:
            self.last_receive_tstamp = time.time()
        return True

    def decode_step(self, gen: Generation) -> None:
        """One decode iteration when the oldest running request produces a token."""
        with self.lock:
            self.tokens_since_log += 1
            if min(self.running.values(), key=lambda g: g.start) is not gen:
                return
            self.decode_steps += 1
            if self.decode_steps % self.decode_log_interval:
                return
            now = time.perf_counter()
            gap, self.last_decode_log = now - self.last_decode_log, now
            self.last_gen_throughput = self.tokens_since_log / gap if gap > 0 else 0.0
            self.tokens_since_log = 0
            running = len(self.running)
            used = sum(g.context_tokens() for g in self.running.values())
        bs = max(self.cuda_graph.decode_sizes or [0]) if self.cuda_graph.decode else 0
        log(f"Decode batch, #running-req: {running}, #token: {used}, "
            f"token usage: {used / self.max_total_tokens:.2f}, cuda graph: {running <= bs}, "
            f"gen throughput (token/s): {self.last_gen_throughput:.2f}, "
            f"#queue-req: {self.queued()}",
            gen.replica.prefix)


class Generation:
    """One request's tokens, paced on an absolute schedule so the speed matches the profile."""

    def __init__(self, state: ServerState, key: tuple[Any, ...], max_new_tokens: int,
                 replica: Replica, first_token_delay: float = 0.0, rid: str | None = None):
        self.state = state
        self.key = key
        self.prompt_tokens = len(key)
        self.max_new_tokens = max(1, int(max_new_tokens))
        self.temperature = 1.0  # SamplingParams' default; only reported, never sampled with
        # GenerateReqInput's return_logprob, top_logprobs_num and return_text_in_logprobs.
        self.return_logprob, self.top_logprobs_num, self.text_in_logprobs = False, 0, False
        self.replica = replica
        self.rid = rid or uuid.uuid4().hex
        self.streaming = False
        self.log_metrics = not self.rid.startswith("HEALTH_CHECK")  # health_generate's
        self.finish_reason: dict[str, Any] | None = None  # a prefill's own (kv_sender)
        self.created = time.time()
        self.start = time.monotonic()
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.produced = 0
        self.cached_tokens = state.cached_prefix(key)
        self.prefilled = 0  # uncached prompt tokens prefilled by earlier chunks
        regress = state.rt.regress
        self.ttft = float(state.rt.profile.get("ttft_s", 0.1)) * regress.ttft + first_token_delay
        # SGLANG_SIM_REGRESS: an internal error or an abort for this request, or None.
        self.outcome = state.regression_outcome() if self.log_metrics else None
        if self.outcome == ABORT:
            self.finish_reason = ABORTED
        # The last output the tokenizer manager received (time, tokens): ITL is observed
        # from one output to the next.
        self.last_output: tuple[float, int] | None = None

    @property
    def planned(self) -> int:
        """The tokens it will produce: all it asks for, or half of them when it is aborted."""
        return max(1, self.max_new_tokens // 2) if self.outcome == ABORT else self.max_new_tokens

    def token(self, i: int) -> int:
        """The id of its i-th output token (SGLANG_SIM_REGRESS outputs=changed shifts them,
        outputs=near takes some near ties: logprobs.chosen)."""
        return logprobs.chosen(i, self.state.rt.regress)

    def output_ids(self, n: int) -> list[int]:
        return [self.token(i) for i in range(n)]

    def text(self, n: int) -> str:
        return "".join(token_text(t) for t in self.output_ids(n))

    def input_ids(self) -> list[int]:
        """The prompt as token ids (a text prompt's words stand for its tokens)."""
        return [t if isinstance(t, int) else 1000 + sum(map(ord, str(t))) % 150000
                for t in self.key]

    def context_tokens(self) -> int:
        return self.prompt_tokens + self.produced

    def chunk_tokens(self) -> int:
        """The uncached prompt tokens of the (last) prefill chunk."""
        return self.prompt_tokens - self.cached_tokens - self.prefilled

    def chunked_prefill(self) -> bool:
        """The chunks before the last, each logged as its own prefill batch once it ran;
        False when the stop came first."""
        st, size = self.state, self.state.chunk_size
        if size <= 0 or self.chunk_tokens() <= size:
            return True
        seconds = size / st.prefill_tok_s * st.rt.time_factor if st.prefill_tok_s else 0.0
        with st.chunks:
            st.chunking += 1
        try:
            while self.chunk_tokens() > size:
                if st.stop_event.wait(seconds):
                    return False
                while st.scheduler_stopped(self.replica):  # a frozen scheduler runs no chunk
                    if st.stop_event.wait(0.1):
                        return False
                st.log_prefill([self], chunk=size, pending=self.chunk_tokens() - size)
                self.prefilled += size
                st.chunk_ended()
        finally:
            with st.chunks:
                st.chunking -= 1
                st.chunks.notify_all()
        return True

    def run(self, on_prefill=None):
        """Yield token indices as they are produced. Raises QueueFull when the replica's
        queue is full, InternalError for a request that SGLANG_SIM_REGRESS errors strikes;
        waits, without a timeout, while its schedulers do not take the batch or stop
        producing (stopped, stuck, dead), as a request waits on SGLang's."""
        st = self.state
        st.admit(self.replica, self.rid)
        with st.lock:
            st.running[self.rid] = self
        lost = False
        try:
            if st.status != STARTING and st.rt.has("tokenizer_watchdog"):
                st.stall_tokenizer()
            if st.tokenizer_stalled:
                st.stop_event.wait()  # the tokenizer's loop stopped: nothing comes out
                return
            if st.status != STARTING and (st.rt.has("detokenizer_crash")
                                          or st.rt.has("detokenizer_hang")):
                st.fail_detokenizer(hang=st.rt.has("detokenizer_hang"))
            st.hub.forward(self.replica.pids, "warming_up" if st.status == STARTING
                           else "serving", self.rid, self.input_ids(),
                           (self.max_new_tokens, self.temperature))
            lost = st.detokenizer_hung
            if lost:
                # The schedulers run the request to its end (their batch lines are logged)
                # and send its tokens to a detokenizer that no longer reads them.
                for _ in self._tokens(on_prefill, delivered=False):
                    pass
            else:
                yield from self._tokens(on_prefill)
        finally:
            with st.lock:
                st.running.pop(self.rid, None)
            st.release(self.replica)
        if lost:
            st.stop_event.wait()  # its client waits for output that never comes

    def _tokens(self, on_prefill, delivered: bool = True):
        """The request's tokens as the schedulers make them; `delivered`: they reach this
        process (the detokenizer passes them on)."""
        st = self.state
        tok_s, regress = st.rt.decode_tok_s(), st.rt.regress
        if not self.chunked_prefill():
            return
        # The last chunk runs as a short prompt's whole prefill does.
        anchor = (time.monotonic() if self.prefilled else self.start) + self.ttft
        for i in range(self.planned):
            delay = anchor + regress.token_time(i, tok_s) - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            while st.scheduler_stopped(self.replica):
                if st.stop_event.wait(0.1):
                    return
                # Time the scheduler stood still is not the profile's.
                self.start, anchor = self.start + 0.1, anchor + 0.1
            if i == 0:
                if self.outcome == ERROR:
                    raise InternalError
                self.first_token_at = time.monotonic()
                # Decode is paced from the first token as it came: a first token that a
                # loaded machine made late must not make the tokens after it come faster.
                anchor = self.first_token_at
                if on_prefill is not None:
                    on_prefill(self)
            self.produced = i + 1
            with st.lock:
                st.generated_tokens += 1
                if delivered:
                    st.last_receive_tstamp = time.time()
                    self._output(st.stats)
            if i:
                st.decode_step(self)
            yield i
        self.finished_at = time.monotonic()
        st.insert(self.key + tuple(range(self.produced)))
        if self.log_metrics:
            with st.lock:
                if self.outcome == ABORT:  # tokenizer_manager.abort_request counts it
                    st.stats.add("sglang:num_aborted_requests_total", "", 1)
                st.stats.finished(self.streaming, self.prompt_tokens, self.cached_tokens,
                                  self.produced, None if self.first_token_at is None
                                  else self.first_token_at - self.start,
                                  self.finished_at - self.start)

    def _output(self, stats: metrics.RequestStats) -> None:
        """The token just produced reaches the tokenizer manager when the request streams,
        every FORCE_STREAM_INTERVAL tokens when it does not, and at its end; from the second
        output on, each observes the inter-token latency of the tokens it brings
        (collect_metrics, observe_inter_token_latency). Called under the state's lock."""
        if not self.log_metrics or not (self.streaming or self.produced == self.planned
                                        or self.produced % FORCE_STREAM_INTERVAL == 0):
            return
        now = time.monotonic()
        if self.last_output is not None:
            at, tokens = self.last_output
            stats.observe_interval(now - at, self.produced - tokens)
        self.last_output = (now, self.produced)

    def finish_type(self) -> str:
        """The OpenAI choice's finish_reason: the finish reason's type (length, abort)."""
        return str((self.finish_reason or {"type": "length"})["type"])

    def meta(self, done: bool) -> dict[str, Any]:
        """meta_info as tokenizer_manager._handle_batch_output builds it; the logprob fields
        (convert_logprob_style) only when the request asked for them."""
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": ((self.finish_reason or {"type": "length", "length": self.produced})
                              if done else None),
            "prompt_tokens": self.prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
        }
        metrics = bool(getattr(self.state.rt.args, "enable_metrics", False))
        if metrics:
            meta["queue_time"] = 0.0
        if self.return_logprob:
            meta.update(logprobs.logprob_meta(
                self.output_ids(self.produced), self.state.rt.regress, self.top_logprobs_num,
                token_text if self.text_in_logprobs else None))
        meta.update(reasoning_tokens=0, completion_tokens=self.produced,
                    cached_tokens=self.cached_tokens)
        if done:
            end = self.finished_at or time.monotonic()
            meta["e2e_latency"] = end - self.start
            if metrics:
                meta["request_received_ts"] = self.created
                if self.first_token_at is not None:
                    meta["first_token_latency"] = self.first_token_at - self.start
                meta["request_finished_ts"] = self.created + (end - self.start)
                if self.produced > 1 and self.first_token_at is not None:
                    meta["decode_throughput"] = (self.produced - 1) / (end - self.first_token_at)
        return meta
