"""sglang/srt/managers/detokenizer_manager.py: the detokenizer turns the schedulers' token ids
into text. The `detokenizer_hang` fault deadlocks it inside a batch's decode, in the frames
0.5.23's event loop runs (handle_batch_token_id_out -> _decode_batch_token_id_output ->
_grouped_batch_decode): a tokenizer lock that is already held, as after a fork that copied
it taken. It never reads the schedulers' output again; they go on."""

from __future__ import annotations

import threading


class DetokenizerManager:
    def __init__(self) -> None:
        self._tokenizer_lock = threading.Lock()
        self._tokenizer_lock.acquire()  # held by a thread that is no more

    def handle_batch_token_id_out(self) -> None:
        self._decode_batch_token_id_output()

    def _decode_batch_token_id_output(self) -> None:
        self._grouped_batch_decode()

    def _grouped_batch_decode(self) -> None:
        with self._tokenizer_lock:  # never taken: the deadlock
            pass
