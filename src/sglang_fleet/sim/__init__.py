"""sglang-sim: a stand-in for `sglang serve` on machines without GPUs (tests, CI, the demo)."""
