"""What the toolkit knows without reading a node, shipped as reviewed data: the flag catalogue
of each SGLang release, models and GPUs, rules of known-bad configurations (data in
sglang_fleet/data)."""
