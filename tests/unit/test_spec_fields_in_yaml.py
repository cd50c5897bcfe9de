"""The playbooks and roles hand a module its LaunchSpec or RouterSpec whole (`from_spec`); a
spec field is named in YAML only where the task's own logic reads it (a condition, a message,
a ledger entry, the interpreter to connect with). This lists each of those uses, so that a field
unpacked by hand into a module's options shows up here as a new, unexplained entry; and no
task file grows past what a reader takes in at once."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
YAML_DIRS = ("roles", "playbooks")
MAX_TASK_FILE_LINES = 150

# A LaunchSpec (or identity) or a RouterSpec under the names the roles give it (a router of
# sglang_fleet_routers_of, a built answer: `item.spec`, `r.spec`, `_built.spec`), then the
# fields read from it; also the list form `['sglang_server_launch_spec', 'group', 'name']` of
# `extract`.
_SPEC = (r"sglang_server_launch_spec|sglang_recover__failed_spec|sglang_server_identity"
         r"|sglang_router__spec|_spec|[a-z_]+\.spec")
_DOTTED = re.compile(rf"(?<![\w])({_SPEC})((?:\.[a-z_]+)+)")
_LISTED = re.compile(rf"\['({_SPEC})'((?:,\s*'[a-z_]+')+)\]")

_REPORT = "the operator's report line"
_LEDGER = "the ledger entry's own field"
_INTERPRETER = "the interpreter the task connects with (the server's own Python)"
_ROLLBACK = "a rollback is refused, before the server is touched, when nothing else was ready"
# file -> {field: why that task's logic reads it}
ALLOWED: dict[str, dict[str, str]] = {
    "playbooks/health.yml": {
        "sglang_server_launch_spec.pd": "a prefill's decodes are judged with it",
        "sglang_server_launch_spec.facts": "the failure block names the Rule's facts",
    },
    "playbooks/recover.yml": {
        "sglang_server_launch_spec.pd": "a PD server's decodes rejoin, its routers are read",
        "sglang_server_launch_spec.group.name": "a failed node takes its whole group along",
    },
    "playbooks/stage.yml": {
        "sglang_server_launch_spec.kernel_cache": "only servers that keep their kernel caches",
    },
    "playbooks/stage_in_use.yml": {
        "sglang_server_launch_spec.kernel_cache": "only servers that keep their kernel caches",
    },
    "playbooks/servers.yml": {
        "sglang_server_launch_spec.group.serves_http": "only the node serving HTTP is judged",
    },
    "playbooks/stop.yml": {
        "sglang_server_identity.deployment": f"{_LEDGER}, and {_REPORT}",
        "sglang_server_identity.paths.log_file": _REPORT,
    },
    "roles/sglang_bench/tasks/measure.yml": {
        "sglang_server_launch_spec.config_hash": _REPORT,
        "sglang_server_launch_spec.group.serves_http": "only the node serving HTTP is measured",
    },
    "roles/sglang_recover/tasks/main.yml": {
        "sglang_server_launch_spec.paths.reboot_mark": "the mark an operator clears",
        "sglang_server_launch_spec.paths.running_spec": _ROLLBACK,
        "sglang_server_launch_spec.settings": _ROLLBACK,
        "sglang_server_launch_spec.facts": _ROLLBACK,
        "sglang_server_launch_spec.config_hash": _ROLLBACK,
    },
    "roles/sglang_recover/tasks/recover.yml": {
        "sglang_server_launch_spec.marker": "the lock owner's description",
    },
    "roles/sglang_recover/tasks/evidence.yml": {
        "_spec.paths.pid_file": "the state re-read under the lock (a restarted server is left)",
        "_spec.install.server_python": _INTERPRETER,
        "_spec.config_hash": "what ran, when the node recorded no running LaunchSpec",
    },
    "roles/sglang_recover/tasks/stop.yml": {
        "_spec.install.server_python": _INTERPRETER,
        "_spec.config_hash": "the failed configuration, recorded in the lock",
    },
    "roles/sglang_recover/tasks/choose.yml": {
        "_spec.settings": "the next configuration is chosen from the inputs",
        "_spec.facts": "the next configuration is chosen by the Rules' facts",
        "_spec.group.name": "one choice for every node of a multi-node server",
    },
    "roles/sglang_recover/tasks/record.yml": {
        "_spec.settings": "a rejected configuration's settings, when the node recorded none",
        "_spec.config_hash": _LEDGER,
        "_spec.deployment": _LEDGER,
        "_spec.facts": _LEDGER,
    },
    "roles/sglang_recover/tasks/redeploy.yml": {
        "_spec.paths.reboot_mark": "the refusal names the mark",
        "_spec.settings.sglang_server_overrides": "the chosen overrides go over the given ones",
        "sglang_server_launch_spec.config_hash": f"{_LEDGER}, and {_REPORT}",
    },
    "roles/sglang_router/tasks/install.yml": {
        "sglang_router__spec.install.pip_requirements": "ansible.builtin.pip's own input, and "
                                                        + _REPORT,
        "sglang_router__spec.install.python": "ansible.builtin.pip's own input",
        "sglang_router__spec.paths.venv": "ansible.builtin.pip's own input, and " + _REPORT,
    },
    "roles/sglang_router/tasks/membership.yml": {
        "sglang_server_launch_spec.group.serves_http": "only a node serving HTTP has routers",
        "sglang_server_launch_spec.pd": "a PD server joins as its side",
        "r.spec.paths.env_file": "the line naming where a refused router's key is read",
    },
    "roles/sglang_router/tasks/stop.yml": {
        "sglang_router__spec.name": _REPORT,
        "sglang_router__spec.paths.log_file": _REPORT,
    },
    "roles/sglang_server/tasks/argcheck.yml": {
        "sglang_server_launch_spec.sglang_version": "the simulator parses as that release",
        "sglang_server_launch_spec.config_hash": "the simulator reads the release's verdict on it",
    },
    "roles/sglang_server/tasks/converge.yml": {
        "sglang_server_launch_spec.install.server_python": _INTERPRETER,
    },
    "roles/sglang_server/tasks/gate.yml": {
        "sglang_server_launch_spec.gate.max_polls": "how many observations the gate repeats",
        "sglang_server_launch_spec.gate.poll_interval": "how long each observation waits",
        "sglang_server_launch_spec.config_hash": _LEDGER,
        "sglang_server_launch_spec.install.env.kind": "only a pip environment is pruned",
        "sglang_server_launch_spec.deployment": _LEDGER,
        "sglang_server_launch_spec.settings": f"{_LEDGER} (the last known good's inputs)",
        "sglang_server_launch_spec.secret_fingerprints": f"{_LEDGER} (for run records)",
    },
    "roles/sglang_server/tasks/install.yml": {
        "sglang_server_launch_spec.install.env": "ansible.builtin.pip's own input (the "
                                                 "environment's folder and requirements)",
        "sglang_server_launch_spec.install.env.kind": "only a pip environment is installed",
        "sglang_server_launch_spec.install.python": "ansible.builtin.pip's own input",
        "sglang_server_launch_spec.install.pip_extra_args": "ansible.builtin.pip's own input",
    },
    "roles/sglang_server/tasks/identity.yml": {
        "sglang_server__identity.spec.group.name": "a stop holds a multi-node server whole",
    },
    "roles/sglang_server/tasks/observe.yml": {
        "_spec.group.name": "a group's lock stays until the whole group has its verdict",
        "_spec.paths.recover_lock": "the lock this run holds, released or renewed by its run",
        "_spec.paths.shm_dir": "the run's segments bound to the lock this run holds",
        "sglang_server_launch_spec.gate.poll_interval": "the delay between observations",
    },
    "roles/sglang_server/tasks/preflight.yml": {
        "sglang_server_launch_spec.paths.root": "the roots a server ran from before (ledger)",
        "sglang_server_launch_spec.sglang_version": "the simulator parses as that release",
        "sglang_server_launch_spec.weights_from_instance": "the seed's /health is asked with "
                                                           "ansible.builtin.uri",
    },
    "roles/sglang_server/tasks/report.yml": {
        "_spec.config_hash": _REPORT,
        "_spec.deployment": _REPORT,
        "_spec.group.name": _REPORT,
        "_spec.group.node_rank": _REPORT,
        "_spec.group.serves_http": _REPORT,
        "_spec.http.url": _REPORT,
    },
    "roles/sglang_server/tasks/service.yml": {
        "sglang_server_launch_spec.group.name": "the group's inventory hosts (controller side)",
    },
    "roles/sglang_server/tasks/spec_fallback.yml": {
        "sglang_server_identity.paths.running_spec": "the LaunchSpec the node recorded is read",
        "sglang_server_launch_spec.config_hash": _REPORT,
    },
    "roles/sglang_server/tasks/verdict.yml": {
        "sglang_server_launch_spec.facts": "the failure block names the Rule's facts",
    },
    "roles/sglang_server/tasks/soak.yml": {
        "sglang_server_launch_spec.group.serves_http": "only a node serving HTTP is soaked",
        "sglang_server_launch_spec.paths.log_file": "a failed soak's evidence names its log",
    },
    "roles/sglang_server/vars/main.yml": {
        "sglang_server_launch_spec.secret_variables": "the secrets' values are read by name",
    },
}


def _yaml_files() -> list[Path]:
    return sorted(p for d in YAML_DIRS for p in (REPO / d).rglob("*.yml"))


def spec_fields_named(text: str) -> set[str]:
    """The spec fields a YAML file names (comments left out)."""
    found: set[str] = set()
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        found.update(m.group(1) + m.group(2) for m in _DOTTED.finditer(line))
        found.update(m.group(1) + "".join("." + f for f in re.findall(r"'([a-z_]+)'",
                                                                        m.group(2)))
                     for m in _LISTED.finditer(line))
    return found


def test_the_finder_sees_both_forms_and_skips_comments():
    text = ("x: \"{{ sglang_server_launch_spec.paths.pid_file }}\"\n"
            "# port: \"{{ sglang_server_launch_spec.http.port }}\"\n"
            "y: \"{{ h | map('extract', hostvars, ['sglang_server_launch_spec', 'group', "
            "'name']) }}\"\n"
            "z: \"{{ sglang_router__spec.admin_url }} {{ _spec.marker }}\"\n"
            "w: \"{{ item.spec.membership.join_timeout }} {{ item.spec }} {{ a.b.spec.x }}\"\n")
    assert spec_fields_named(text) == {
        "sglang_server_launch_spec.paths.pid_file", "sglang_server_launch_spec.group.name",
        "_spec.marker", "sglang_router__spec.admin_url", "item.spec.membership.join_timeout",
        "b.spec.x"}


def test_no_spec_field_is_unpacked_by_hand_outside_the_listed_uses():
    named = {}
    for path in _yaml_files():
        fields = spec_fields_named(path.read_text())
        if fields:
            named[str(path.relative_to(REPO))] = fields
    unexplained = {f: sorted(fields - set(ALLOWED.get(f, {})))
                   for f, fields in named.items() if fields - set(ALLOWED.get(f, {}))}
    assert not unexplained, (
        f"spec fields named by hand in YAML: {unexplained}. Give the module `from_spec` (its "
        "view is in src/sglang_fleet/launch/views.py, a router's in router/views.py), or, where "
        "the task's own logic reads the field, list it in ALLOWED with why")
    stale = {f: sorted(set(allowed) - named.get(f, set()))
             for f, allowed in ALLOWED.items() if set(allowed) - named.get(f, set())}
    assert not stale, f"ALLOWED lists fields no longer named there: {stale}"


def test_no_task_file_is_over_150_lines():
    """Tasks and plays (a role's defaults and argument specs are tables, generated)."""
    tasks = sorted((REPO / "roles").glob("*/tasks/*.yml")) + sorted(
        (REPO / "playbooks").rglob("*.yml"))
    assert len(tasks) > 20
    long = {str(p.relative_to(REPO)): n for p in tasks
            if (n := len(p.read_text().splitlines())) > MAX_TASK_FILE_LINES}
    assert not long, f"task files over {MAX_TASK_FILE_LINES} lines: {long}; split them in stages"
