"""Real SGLang as the reference, for developers and CI (never imported by a deploy):
reference environments of real releases, the probe that runs inside them, the fidelity
measure."""
