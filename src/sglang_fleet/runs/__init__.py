"""Playbook runs through ansible-runner and what the CLI makes of them: the runner, each host's
outcome from the events, live progress, reasons, advice (what to say of a verdict), the summary
(exit codes, JSON, JUnit), the controller's state files, Prometheus metrics, the inventory
read, slices and whole groups."""
