"""Prefill/decode disaggregation in the simulator: the bootstrap server and the KV transfer."""
