"""What to say of a verdict, and what to do about it: one block per host that is not ready.

    sim-node-1: crashed in loading_weights: TP0-7: KeyError: '...' (log line 212); ...
    Cause: configuration (a Rule or a flag: change the configuration)
    Next: ...
    Rule flashinfer-mla-sm120-graph-capture-hang matches: ... Fix: set ...
    Fix: recover it: sglang-fleet recover --limit sim-node-1 (or ansible-playbook ...)
    Evidence: /path

health.yml, the deploy's gate and the CLI all word a failure through here, so that it reads
the same everywhere: the verdict with its cause, once, with its fix and where the evidence is.
"""

from __future__ import annotations

from typing import Any

from sglang_fleet.known.rules import matching_rules
from sglang_fleet.node.common import vocab
from sglang_fleet.node.common.text import inert

CAUSE_MEANING = {
    vocab.CONFIGURATION: "a Rule or a flag: the configuration changes",
    vocab.ENVIRONMENT: "the node's: fix the node, the configuration stays",
    vocab.EXTERNAL: "a signal from outside SGLang: the configuration stays",
    vocab.HARDWARE: "the GPU's: the configuration stays",
}
# A stop recorded by the operator's own playbook: nothing to fix.
OPERATOR_STOPS = ("stop.yml",)


def operator_stopped(verdict: dict[str, Any]) -> bool:
    """Whether the server was stopped on purpose by stop.yml (health passes it)."""
    return (verdict.get("verdict") == vocab.STOPPED
            and verdict.get("stopped_by") in OPERATOR_STOPS)


def _fix(verdict: dict[str, Any], host: str) -> str:
    limit = f"--limit {host}"
    name, cause = verdict.get("verdict"), verdict.get("cause")
    deploy = f"sglang-fleet deploy {limit}, or ansible-playbook deploy.yml {limit}"
    recover = (f"sglang-fleet recover {limit}, or ansible-playbook playbooks/recover.yml "
               f"{limit}")
    if name == vocab.STOPPED and verdict.get("stopped_by") == "a recovery":
        return f"finish the recovery ({recover})"
    if name == vocab.STOPPED:
        return f"nothing, if it was meant to stop; else start it again: {deploy}"
    if name == vocab.ABSENT:
        return f"deploy it ({deploy})"
    if cause == vocab.ENVIRONMENT:
        return f"fix the node, then recover it on the same configuration ({recover})"
    if cause == vocab.EXTERNAL:
        return (f"find what sent the signal, then recover it on the same configuration "
                f"({recover})")
    if name == vocab.GPU_FAULT:
        return f"recover it ({recover}); if the GPU stays faulty, drain the node"
    return f"recover it ({recover})"


def failure_block(verdict: dict[str, Any], host: str, facts: dict[str, Any] | None = None,
                  evidence: str | None = None) -> str:
    """The verdict of one host in words, whole: headline, cause, next step, a matching Rule,
    the fix and the evidence path. Node text in it is made inert."""
    phrase = vocab.verdict_phrase(verdict.get("verdict"), verdict.get("phase"))
    headline = verdict.get("headline") or f"{phrase}: {verdict.get('reason')}"
    lines = [f"{host}: {headline}"]
    cause = verdict.get("cause")
    if cause in CAUSE_MEANING and verdict.get("verdict") != vocab.READY:
        lines.append(f"Cause: {cause} ({CAUSE_MEANING[cause]})")
    if verdict.get("advice"):
        lines.append(f"Next: {verdict['advice']}")
    if facts and verdict.get("verdict") in (vocab.STALLED, vocab.CRASHED) \
            and cause in (None, vocab.CONFIGURATION):
        for rule in matching_rules(dict(facts)):
            lines.append(f"Rule {rule.id} matches: {' '.join(rule.symptom.split())} Fix: set "
                         f"{rule.fix_variable}={rule.fix_value!r}")
    if verdict.get("verdict") == vocab.PROGRESSING:
        limit = f"--limit {host}"
        return inert(f"{lines[0]}. It is still starting: ask again later, or follow it with "
                     f"sglang-fleet deploy {limit}")
    if verdict.get("verdict") != vocab.READY and not operator_stopped(verdict):
        lines.append(f"Fix: {_fix(verdict, host)}")
    if evidence:
        lines.append(f"Evidence: {evidence}")
    if len(lines) == 2 and lines[1].startswith("Fix: "):
        lines = [f"{lines[0]}. {lines[1]}"]  # nothing else to say: one line
    return inert("\n".join(lines))
