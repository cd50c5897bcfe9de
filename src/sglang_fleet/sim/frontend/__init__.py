"""The simulated server's face: its HTTP API, serving state, metrics, request log and the
control channel tests drive it with."""
