"""SGLang 0.5.23's request log (`--log-requests`), as sglang/srt/utils/request_logger.py writes
it: a `Receive: obj=GenerateReqInput(...)` record when a request arrives (before it is
validated) and a `Finish: obj=..., out={...}` record when it is answered, through the request
logger's own handler (`[%(asctime)s] %(message)s`, no rank prefix). `--log-requests-level`
decides which fields are written and how long strings may be (`_compute_metadata`); strings
are written with repr(), so a prompt's newlines never start a line of the log.
`--log-requests-format json` writes one JSON object per record instead (`log_json`).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

# GenerateReqInput's fields in their dataclass order (managers/io_struct.py), with the
# defaults a request that does not set them logs.
FIELDS: tuple[tuple[str, Any], ...] = (
    ("rid", None), ("session_id", None), ("text", None), ("input_ids", None),
    ("input_embeds", None), ("image_data", None), ("video_data", None), ("audio_data", None),
    ("mm_hashes", None), ("mm_content_hashes", None), ("use_audio_in_video", False),
    ("video_config", None), ("sampling_params", None), ("watermark", None),
    ("return_logprob", None), ("logprob_start_len", None), ("top_logprobs_num", None),
    ("token_ids_logprob", None), ("return_sampling_mask", None),
    ("sampling_logprobs_mode", None), ("return_text_in_logprobs", False),
    ("return_flat_raw_top_logprobs", False), ("return_flat_raw_output_top_logprobs", False),
    ("stream", False), ("log_metrics", True), ("return_hidden_states", False),
    ("return_routed_experts", False), ("routed_experts_start_len", 0),
    ("return_indexer_topk", False), ("modalities", None), ("session_params", None),
    ("lora_path", None), ("lora_id", None), ("custom_logit_processor", None),
    ("positional_embed_overrides", None), ("bootstrap_host", None), ("bootstrap_port", None),
    ("bootstrap_room", None), ("bootstrap_pair_key", None), ("decode_tp_size", None),
    ("routed_dp_rank", None), ("data_parallel_rank", None), ("disagg_prefill_dp_rank", None),
    ("routing_key", None), ("conversation_id", None), ("http_worker_ipc", None),
    ("background", False), ("require_reasoning", False), ("max_thinking_tokens", None),
    ("priority", None), ("extra_key", None), ("no_logs", False), ("custom_labels", None),
    ("return_bytes", False), ("return_entropy", False), ("return_prompt_token_ids", False),
    ("external_trace_header", None), ("received_time", None),
)
_INPUTS = {"text", "input_ids", "input_embeds", "image_data", "audio_data", "video_data",
           "lora_path"}
# (max string or list length, fields left out of obj, fields left out of out) per level.
LEVELS = {
    0: (1 << 30, _INPUTS | {"sampling_params"}, {"text", "output_ids", "embedding"}),
    1: (1 << 30, _INPUTS, {"text", "output_ids", "embedding"}),
    2: (2048, set(), set()),
    3: (1 << 30, set(), set()),
}


def truncated(data: Any, max_length: int, skip: set[str] | None = None) -> str:
    """_dataclass_to_string_truncated, for the shapes a request holds."""
    skip = skip or set()
    if isinstance(data, str):
        if len(data) > max_length:
            half = max_length // 2
            return f"{data[:half]!r} ... {data[-half:]!r}"
        return repr(data)
    if isinstance(data, (list, tuple)):
        if len(data) > max_length:
            half = max_length // 2
            return f"{list(data[:half])} ... {list(data[-half:])}"
        return str(list(data))
    if isinstance(data, dict):
        parts = [f"'{k}': {truncated(v, max_length)}" for k, v in data.items() if k not in skip]
        return "{" + ", ".join(parts) + "}"
    return str(data)


def _obj(body: dict[str, Any], rid: str, received: float, max_length: int,
         skip: set[str]) -> str:
    values = dict(FIELDS)
    values.update({k: v for k, v in body.items() if k in values})
    values.update(rid=rid, received_time=received)
    parts = [f"{name}={truncated(values[name], max_length)}" for name, _ in FIELDS
             if name not in skip]
    return "GenerateReqInput(" + ", ".join(parts) + ")"


def _json_data(value: Any, max_length: int, skip: set[str]) -> Any:
    if isinstance(value, str):
        return (value[:max_length // 2] + "..." + value[-(max_length // 2):]
                if len(value) > max_length else value)
    if isinstance(value, dict):
        return {k: _json_data(v, max_length, set()) for k, v in value.items() if k not in skip}
    if isinstance(value, (list, tuple)):
        return [_json_data(v, max_length, set()) for v in value]
    return value


def received(body: dict[str, Any], rid: str, level: int, fmt: str = "text") -> str:
    """The message of the record of a request as it arrives."""
    max_length, skip, _ = LEVELS[level]
    now = datetime.now().timestamp()
    if fmt == "json":
        obj = dict(dict(FIELDS), **{k: v for k, v in body.items() if k in dict(FIELDS)},
                   rid=rid, received_time=now)
        return json.dumps({"timestamp": datetime.now().isoformat(),
                           "event": "request.received", "rid": rid,
                           "obj": _json_data(obj, max_length, skip)}, ensure_ascii=False)
    return f"Receive: obj={_obj(body, rid, now, max_length, skip)}"


def finished(body: dict[str, Any], rid: str, out: Any, level: int,
             fmt: str = "text") -> str:
    """The message of the record of a request once it is answered."""
    max_length, skip, out_skip = LEVELS[level]
    if fmt == "json":
        obj = dict(dict(FIELDS), **{k: v for k, v in body.items() if k in dict(FIELDS)},
                   rid=rid)
        return json.dumps({"timestamp": datetime.now().isoformat(),
                           "event": "request.finished", "rid": rid,
                           "obj": _json_data(obj, max_length, skip),
                           "out": _json_data(out, max_length, out_skip)}, ensure_ascii=False)
    return (f"Finish: obj={_obj(body, rid, 0.0, max_length, skip)}, "
            f"out={truncated(out, max_length, out_skip)}")
