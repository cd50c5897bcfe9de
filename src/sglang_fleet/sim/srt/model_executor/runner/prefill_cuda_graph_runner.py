"""sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py: PrefillCudaGraphRunner
captures one breakable graph per token count in capture_one_shape."""

from __future__ import annotations

from collections.abc import Callable


class PrefillCudaGraphRunner:
    def capture_one_shape(self, size: int, forward: Callable[[], None]) -> None:
        forward()
