"""Measurement on live nodes: the results store, reports, the zero-drop load generator, and
the experiments (sweep and bisect trials, delta debugging)."""
