"""The run record: one self-contained page (run.html) and its JSON (run.json) per run, built
from the run's events, summary, ledger and evidence (build), rendered (page), written and kept
(history), and streamed by the stdout callback for plain ansible-playbook runs (recorder)."""
