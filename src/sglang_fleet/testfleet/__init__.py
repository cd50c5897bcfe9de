"""The demo and test fleet, not the product: harnesses for simulated fleets used by the tests
and the benchmark scripts: local fleets (every node a folder and a loopback port on this
machine), fleets reached over real SSH (an sshd per node), and a node that runs a real,
isolated systemd. They drive this checkout's playbooks, so they work from a checkout of the
repository. Product code never imports this package or sglang_fleet.sim (tests/unit/
test_layering.py)."""
