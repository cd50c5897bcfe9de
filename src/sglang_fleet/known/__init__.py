"""What the toolkit knows of SGLang without reading a node, shipped as reviewed data: the flag
catalogue of each release, SGLang's own post-parse refusals (sglang_checks), models and GPUs,
rules of known-bad configurations (the data is in sglang_fleet/data)."""
