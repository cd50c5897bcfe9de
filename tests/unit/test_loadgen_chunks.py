"""The load generator reads both APIs' streams the same way: tokens, finish, abort, error."""

from __future__ import annotations

from sglang_fleet.bench.loadgen import Request, read_chunk, request_body


def test_each_api_streams_its_own_request():
    path, body = request_body("chat", "hi", 7)
    assert path == "/v1/chat/completions"
    assert body["messages"] == [{"role": "user", "content": "hi"}] and body["max_tokens"] == 7
    assert body["stream"] is True
    path, body = request_body("generate", "hi", 7)
    assert path == "/generate" and body["sampling_params"]["max_new_tokens"] == 7


def test_a_chat_stream_counts_a_token_per_content_chunk_and_ends_at_its_finish_reason():
    record = Request("r", 0.0)
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                         "finish_reason": None}]}
    token = {"choices": [{"index": 0, "delta": {"content": " a"}, "finish_reason": None}]}
    final = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    assert [read_chunk(c, record) for c in (role, token, token, final)] == \
        [False, False, False, True]
    assert record.tokens == 2 and not record.error


def test_an_error_event_and_a_generate_abort_are_recorded():
    record = Request("r", 0.0)
    read_chunk({"error": {"message": "KVTransferError(bootstrap_room=3)", "code": 500}}, record)
    assert record.error.startswith("error event: ") and "bootstrap_room=3" in record.error
    record = Request("r", 0.0)
    abort = {"text": "", "meta_info": {"completion_tokens": 0, "finish_reason": {
        "type": "abort", "message": "timed out", "status_code": 500}}}
    assert read_chunk(abort, record) is True
    assert record.abort == "500: timed out"
