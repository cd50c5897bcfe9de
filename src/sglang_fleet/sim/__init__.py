"""sglang-sim: a stand-in for `sglang serve` on machines without GPUs (tests, CI, the demo).
Not the product: no product module imports it (tests/unit/test_layering.py); a node runs it
only when its LaunchSpec says the install is the simulator. launch_server is its entry point
(`python -m sglang_fleet.sim.launch_server`, `sglang-sim`); args, engine, frontend and pd
hold what it is made of."""
