"""sglang-fleet: deploy, gate, recover and measure SGLang servers on GPU fleets."""

__version__ = "0.1.0"
