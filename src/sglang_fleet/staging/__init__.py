"""Model weights staged once per fleet: sources, manifests, the chain of nodes (docs/weights.md)."""
