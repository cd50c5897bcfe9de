"""Rollouts judged by what clients feel: a canary's plan (plan), SGLang's and the router's
Prometheus counters and histograms (metrics), the judgement of a canary against the servers
still on the baseline (judge), and the window that samples both under live traffic (window).
docs/rollouts.md describes the signals and their defaults."""
