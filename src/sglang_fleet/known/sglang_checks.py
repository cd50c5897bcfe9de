"""SGLang's own refusals of a command line after its parser accepted it, before any worker
starts, per release: the checks of its argument resolution (ServerArgs.resolve_once), of
check_server_args, and of the parallel topology it validates when the configuration is
published. The controller runs them on every host's parsed command line; the simulator runs
them as SGLang does and fails with the same message and exit path.

Each check names the release's own source file, line and statement; tests/reference runs
every one against the installed release and holds the message, the file and the line to
it. Checks that need the model or the hardware to decide (most of the resolution's hooks) are
the node check's: it asks the installed SGLang for its verdict on the node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# Object-storage model URIs SGLang exempts from the served-name check
# (sglang/srt/utils/runai_utils.py SUPPORTED_SCHEMES).
RUNAI_SCHEMES = ("s3://", "gs://", "az://")


@dataclass(frozen=True)
class Refusal:
    check: str
    stage: str  # resolve, check or publish: where in a server's start SGLang refuses it
    error: str  # the exception SGLang raises
    message: str  # its message; "" for a bare assert
    source: str  # the release's file, from the package root
    line: int
    function: str
    code: str  # the statement, as a traceback shows it
    dests: tuple[str, ...]  # the parsed destinations whose values it refuses
    fix: str
    frames: tuple[Frame, ...]  # SGLang's traceback down to the check, outermost first

    @property
    def final_line(self) -> str:
        """SGLang's own last line: what its traceback ends with."""
        return f"{self.error}: {self.message}" if self.message else self.error

    def describe(self) -> str:
        where = f"{self.source}:{self.line}"
        if self.message:
            return f"{self.final_line} ({where})"
        return f"{self.final_line} at {where}: {self.code}"


Values = Mapping[str, Any]


@dataclass(frozen=True)
class Frame:
    """One frame of a traceback: the file from the package root, line, function, statement."""

    file: str
    line: int
    function: str
    code: str


# The frames above each check in a 0.5.23 server's traceback, outermost first (python -m
# sglang.launch_server; tests/reference holds each statement to the release's file and line).
_PIPELINE = "sglang/srt/arg_groups/pipeline.py"
_LAUNCH = Frame("sglang/launch_server.py", 84, "<module>", "run_server(server_args)")
_ENGINE = Frame("sglang/srt/entrypoints/http_server.py", 3156, "launch_server",
                ") = Engine._launch_subprocesses(")
STAGE_FRAMES: dict[str, tuple[Frame, ...]] = {
    "resolve": (
        _LAUNCH,
        Frame("sglang/launch_server.py", 29, "run_server", "server_args.resolve_once()"),
        Frame("sglang/srt/server_args.py", 277, "resolve_once",
              "run_resolution_pipeline(self)"),
        Frame(_PIPELINE, 274, "run_resolution_pipeline",
              "run_hook(handle_data_parallelism, server_args)"),
        Frame("sglang/srt/arg_groups/resolution_hooks.py", 139, "run_hook",
              "step(server_args)"),
    ),
    "check": (
        _LAUNCH,
        Frame("sglang/launch_server.py", 67, "run_server", "launch_server(server_args)"),
        _ENGINE,
        Frame("sglang/srt/entrypoints/engine.py", 1165, "_launch_subprocesses",
              "server_args.check_server_args()"),
        Frame("sglang/srt/server_args.py", 511, "check_server_args",
              "check_server_args(self)"),
    ),
    "publish": (
        _LAUNCH,
        Frame("sglang/launch_server.py", 67, "run_server", "launch_server(server_args)"),
        _ENGINE,
        Frame("sglang/srt/entrypoints/engine.py", 1175, "_launch_subprocesses",
              'publish(server_args, role="tokenizer")'),
        Frame("sglang/srt/runtime_context.py", 1515, "publish",
              "return _configure_context(_CONTEXT, server_args, role=role, ranks=ranks)"),
        Frame("sglang/srt/runtime_context.py", 1568, "_configure_context",
              "context.parallel.override_permanently(attn_dcp_rank=0)"),
        Frame("sglang/srt/runtime_context.py", 420, "override_permanently",
              '_validate_parallel(self, "override_permanently")'),
    ),
}


@dataclass(frozen=True)
class Check:
    id: str
    stage: str  # resolve (ServerArgs.resolve_once), check (check_server_args) or publish
    error: str
    source: str
    line: int
    function: str
    code: str
    dests: tuple[str, ...]
    # None when the values pass, else SGLang's message ("" for a bare assert)
    test: Callable[[Values], str | None]
    fix: str  # the operator's way out, formatted with the resolved values
    # The resolution pipeline's call of the hook holding the check, where that hook is not
    # handle_data_parallelism (the resolve stage's frames name that one).
    pipeline_call: Frame | None = None

    def refusal(self, values: Values) -> Refusal | None:
        message = self.test(values)
        if message is None:
            return None
        own = Frame(self.source, self.line, self.function, self.code)
        frames = tuple(self.pipeline_call if self.pipeline_call and f.file == _PIPELINE else f
                       for f in STAGE_FRAMES[self.stage])
        return Refusal(self.id, self.stage, self.error, message, self.source, self.line,
                       self.function, self.code, self.dests,
                       self.fix.format_map(dict(values)), frames + (own,))


def resolved(values: Values) -> dict[str, Any]:
    """The parsed values as SGLang's checks read them: the deprecated --enable-dp-attention
    turned into --attn-dp-size (parallel_hook.handle_deprecated_dp_attention, the first
    hook), the served name defaulted to the model path
    (serving_hook.handle_missing_default_values)."""
    v = dict(values)
    if v.get("enable_dp_attention"):
        if v.get("attn_dp_size", 1) == 1:
            v["attn_dp_size"], v["dp_size"] = v.get("dp_size", 1), 1
        v["enable_dp_attention"] = False
    if v.get("served_model_name") is None:
        v["served_model_name"] = v.get("model_path")
    return v


def _topology_problems(v: Values) -> str | None:
    """runtime_context._validate_parallel's factorizations, as publish checks them."""
    tp, a_dp, a_cp = v["tp_size"], v.get("attn_dp_size", 1), v.get("attn_cp_size", 1)
    ep, m_dp = v.get("ep_size", 1), v.get("moe_dp_size", 1)
    if not all(isinstance(x, int) and x > 0 for x in (tp, a_dp, a_cp, ep, m_dp)):
        return None
    a_tp = tp // a_dp // a_cp
    m_tp = tp // ep // m_dp
    problems = []
    if tp != a_tp * a_dp * a_cp:
        problems.append("tp_size == attn_tp_size * attn_dp_size * attn_cp_size\n"
                        f"  {tp} != {a_tp} * {a_dp} * {a_cp} (= {a_tp * a_dp * a_cp})")
    if tp != ep * m_dp * m_tp:
        problems.append("tp_size == moe_ep_size * moe_dp_size * moe_tp_size\n"
                        f"  {tp} != {ep} * {m_dp} * {m_tp} (= {ep * m_dp * m_tp})")
    if not problems:
        return None
    return ("parallel topology is inconsistent (set by override_permanently):\n"
            + "\n".join(problems))


def _served_name(v: Values) -> str | None:
    name = v.get("served_model_name")
    if not isinstance(name, str) or name.lower().startswith(RUNAI_SCHEMES) or ":" not in name:
        return None
    return ("served_model_name cannot contain a colon (':') character. The colon is reserved "
            "for the 'model:adapter' syntax used in LoRA adapter specification. "
            f"Invalid value: '{name}'")


def _when(condition: Callable[[Values], bool], message: str
          ) -> Callable[[Values], str | None]:
    """A check that refuses when `condition` holds, with a fixed message."""
    return lambda v: message if condition(v) else None


_PARALLEL = "sglang/srt/arg_groups/parallel_hook.py"
_PD = "sglang/srt/arg_groups/pd_disaggregation_hook.py"
_VALIDATION = "sglang/srt/arg_groups/validation_hook.py"


def _resolve_check(check_id: str, line: int, code: str, dests: tuple[str, ...],
                   test: Callable[[Values], str | None], fix: str, error: str = "ValueError"
                   ) -> Check:
    return Check(check_id, "resolve", error, _PARALLEL, line, "handle_data_parallelism", code,
                 dests, test, fix)


def _server_check(check_id: str, line: int, code: str, dests: tuple[str, ...],
                  test: Callable[[Values], str | None], fix: str) -> Check:
    return Check(check_id, "check", "AssertionError", _VALIDATION, line, "check_server_args",
                 code, dests, test, fix)


# SGLang 0.5.23, in the order a server meets them.
CHECKS_0_5_23: tuple[Check, ...] = (
    Check("prefill-transfer-backend", "resolve", "AssertionError", _PD, 146,
          "handle_pd_disaggregation", 'assert cfg.disaggregation_transfer_backend != "fake", (',
          ("disaggregation_transfer_backend", "disaggregation_mode"),
          _when(lambda v: v.get("disaggregation_mode") == "prefill"
                and v.get("disaggregation_transfer_backend") == "fake",
                "Prefill server does not support 'fake' as the transfer backend"),
          "use mooncake, nixl or mori on a prefill server (fake only serves synthetic decode "
          "benchmarks)",
          pipeline_call=Frame(_PIPELINE, 147, "run_resolution_pipeline",
                              "run_hook(handle_pd_disaggregation, server_args)")),
    _resolve_check(
        "attn-dp-positive", 286,
        'raise ValueError(f"--attn-dp-size must be positive (got {cfg.attn_dp_size}).")',
        ("attn_dp_size",),
        lambda v: (f"--attn-dp-size must be positive (got {v['attn_dp_size']})."
                   if v.get("attn_dp_size", 1) < 1 else None),
        "set --attn-dp-size to 1 or more"),
    _resolve_check(
        "dp-with-attn-dp", 288, "raise ValueError(", ("dp_size", "attn_dp_size"),
        lambda v: (f"--dp-size {v['dp_size']} with --attn-dp-size {v['attn_dp_size']}: "
                   "data-parallel replicas combined with attention data parallelism are not "
                   "supported."
                   if v.get("attn_dp_size", 1) > 1 and v.get("dp_size", 1) > 1 else None),
        "use either data-parallel replicas (sglang_server_dp) or attention DP "
        "(--attn-dp-size), not both"),
    _resolve_check(
        "tp-divides-attn-dp", 326, "assert cfg.tp_size % cfg.attn_dp_size == 0",
        ("attn_dp_size", "tp_size"),
        lambda v: ("" if v.get("attn_dp_size", 1) > 1 and v["tp_size"] % v["attn_dp_size"]
                   else None),
        "use an attention-DP size (--attn-dp-size, or the deprecated --enable-dp-attention "
        "with --dp-size) that divides the TP size {tp_size}", error="AssertionError"),
    _server_check(
        "tp-pp-over-nodes", 179, "assert (cfg.tp_size * cfg.pp_size) % cfg.nnodes == 0, (",
        ("tp_size", "pp_size", "nnodes"),
        _when(lambda v: v.get("ep_join_mode") != "scale" and v.get("nnodes", 1) > 0 and
              (v["tp_size"] * v.get("pp_size", 1)) % v.get("nnodes", 1) != 0,
              "tp_size must be divisible by number of nodes"),
        "make tp x pp ({tp_size} x {pp_size}) a multiple of the node count {nnodes}"),
    _server_check(
        "pp-micro-batch", 183,
        "assert cfg.pp_max_micro_batch_size is None or cfg.pp_max_micro_batch_size >= 1, (",
        ("pp_max_micro_batch_size",),
        lambda v: ("pp_max_micro_batch_size must be a positive integer or None (for "
                   f"auto-compute). Got: {v['pp_max_micro_batch_size']}"
                   if v.get("pp_max_micro_batch_size") is not None
                   and v["pp_max_micro_batch_size"] < 1 else None),
        "set --pp-max-micro-batch-size to 1 or more, or leave it out"),
    _server_check(
        "graph-padding-vs-compile", 188,
        "assert not (cfg.disable_cuda_graph_padding and cfg.enable_torch_compile), (",
        ("disable_cuda_graph_padding", "enable_torch_compile"),
        _when(lambda v: bool(v.get("disable_cuda_graph_padding")
                             and v.get("enable_torch_compile")),
              "--disable-cuda-graph-padding is incompatible with --enable-torch-compile. "
              "With padding disabled, every distinct batch size gets its own torch.compile + "
              "Triton autotune cycle (O(max_batch_size) compilations) instead of the small "
              "fixed set of padded bucket sizes, causing engine initialisation to stall for "
              "many minutes. Remove --disable-cuda-graph-padding or --enable-torch-compile."),
        "remove --disable-cuda-graph-padding or --enable-torch-compile"),
    _server_check(
        "multi-node-dp", 199, "assert not (cfg.dp_size > 1 and cfg.nnodes != 1), (",
        ("dp_size", "nnodes"),
        _when(lambda v: v.get("dp_size", 1) > 1 and v.get("nnodes", 1) != 1,
              "multi-node data-parallel replicas are not supported; use attention DP "
              "(--attn-dp-size) across nodes"),
        "set sglang_server_dp: 1 and use --attn-dp-size across the {nnodes} nodes"),
    _server_check(
        "base-gpu-id", 204, 'assert cfg.base_gpu_id >= 0, "base_gpu_id must be non-negative"',
        ("base_gpu_id",),
        _when(lambda v: v.get("base_gpu_id", 0) < 0, "base_gpu_id must be non-negative"),
        "set --base-gpu-id to 0 or more"),
    _server_check(
        "gpu-id-step", 205, 'assert cfg.gpu_id_step >= 1, "gpu_id_step must be positive"',
        ("gpu_id_step",),
        _when(lambda v: v.get("gpu_id_step", 1) < 1, "gpu_id_step must be positive"),
        "set --gpu-id-step to 1 or more"),
    _server_check(
        "moe-dense-tp", 207, "assert cfg.moe_dense_tp_size in (", ("moe_dense_tp_size",),
        _when(lambda v: v.get("moe_dense_tp_size") not in (None, 1, v["tp_size"]),
              "moe_dense_tp_size only supports None, 1, or tp_size currently"),
        "set --moe-dense-tp-size to 1 or {tp_size}, or leave it out"),
    _server_check(
        "served-name-colon", 215, 'assert ":" not in cfg.served_model_name, (',
        ("served_model_name",), _served_name,
        "serve the model under a name without ':' (sglang_server_served_model_name)"),
    _server_check(
        "tokenizer-workers", 273,
        'assert cfg.tokenizer_worker_num > 0, "Tokenizer worker num must >= 1"',
        ("tokenizer_worker_num",),
        _when(lambda v: v.get("tokenizer_worker_num", 1) <= 0,
              "Tokenizer worker num must >= 1"),
        "set --tokenizer-worker-num to 1 or more"),
    _server_check(
        "detokenizer-workers", 274,
        'assert cfg.detokenizer_worker_num > 0, "Detokenizer worker num must >= 1"',
        ("detokenizer_worker_num",),
        _when(lambda v: v.get("detokenizer_worker_num", 1) <= 0,
              "Detokenizer worker num must >= 1"),
        "set --detokenizer-worker-num to 1 or more"),
    _server_check(
        "mm-processor-workers", 275,
        'assert cfg.mm_processor_worker_num >= 0, "Multimodal processor worker num must >= 0"',
        ("mm_processor_worker_num",),
        _when(lambda v: v.get("mm_processor_worker_num", 0) < 0,
              "Multimodal processor worker num must >= 0"),
        "set --mm-processor-worker-num to 0 or more"),
    _server_check(
        "mm-io-workers", 276,
        'assert cfg.mm_io_worker_num >= 0, "Multimodal I/O worker num must >= 0"',
        ("mm_io_worker_num",),
        _when(lambda v: v.get("mm_io_worker_num", 0) < 0, "Multimodal I/O worker num must >= 0"),
        "set --mm-io-worker-num to 0 or more"),
    Check("parallel-topology", "publish", "ValueError", "sglang/srt/runtime_context.py", 347,
          "_validate_parallel", "raise ValueError(",
          ("ep_size", "tp_size", "attn_cp_size", "attn_dp_size", "moe_dp_size"),
          _topology_problems,
          "use an expert-parallel size (sglang_server_ep) that divides the TP size "
          "{tp_size}, and attention-DP x attention-CP sizes that divide it"),
)

# The controller mirrors 0.5.23's checks only. SGLang 0.5.4.post3 has its own, with other
# conditions and texts, in ServerArgs.check_server_args (sglang/srt/server_args.py:3649), none
# mirrored here: for that release the controller checks nothing after the parser, and the
# node check (module_utils/deploy/argcheck._PARSE) runs the installed SGLang's check_server_args on
# the exact command line before anything on the node changes.
CHECKS: dict[str, tuple[Check, ...]] = {
    "0.5.23": CHECKS_0_5_23,
    "0.5.4.post3": (),
}


def refusals(version: str, values: Values) -> list[Refusal]:
    """Every check of the release that the parsed values fail, in the order SGLang meets
    them (SGLang itself stops at the first)."""
    v = resolved(values)
    found = []
    for check in CHECKS.get(version, ()):
        try:
            refusal = check.refusal(v)
        except (KeyError, TypeError):  # a value this release's parser does not produce
            continue
        if refusal is not None:
            found.append(refusal)
    return found
