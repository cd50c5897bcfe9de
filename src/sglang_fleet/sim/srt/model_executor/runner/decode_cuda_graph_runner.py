"""sglang/srt/model_executor/runner/decode_cuda_graph_runner.py: DecodeCudaGraphRunner
captures one graph per batch size in capture_one_shape (the incident's busy-wait hung here)."""

from __future__ import annotations

from collections.abc import Callable


class DecodeCudaGraphRunner:
    def capture_one_shape(self, size: int, forward: Callable[[], None]) -> None:
        forward()
