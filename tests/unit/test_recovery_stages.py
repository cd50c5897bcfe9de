"""Recovery's stages (roles/sglang_recover/tasks): each a file of its own, imported in
docs/recovery.md's order into the one block whose `always` releases the deployment's lock, so
that a failure in any stage releases it and fails the host as before the split. Each stage's
tasks are pinned here, with the safety each one owes; test_recover.py runs them end to end
(STAGE_TESTS names the runs that cover each)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "roles" / "sglang_recover" / "tasks"
LOCK_BLOCK = "Recover while holding the lock"

# Each stage's tasks, in order (nested blocks flattened, depth first).
STAGES = {
    "evidence": [
        "Say that this run finishes an interrupted recovery",
        "Read the deployment's state under the lock",
        "Leave a server that another run restarted after it was judged",
        "Keep the evidence before anything is killed",
        "Fetch the evidence to the controller",
        "Take the configuration that ran from the evidence, and keep the failed verdict",
        "Say when the node recorded no LaunchSpec of the running server",
    ],
    "stop": [
        "Stop the deployment's processes and verify its GPUs free",
        "Keep what the stop did with the evidence (processes without the marker included)",
        "Record in the lock that the deployment is stopped",
        "Resume the recovery that a killed run left after its stop",
        "Remove the stopped run's leaked shared-memory segments",
    ],
    "choose": [
        "Choose the next configuration",
        "Say why the rollback was asked for",
        "Take one choice for every node of a multi-node server",
        "Record the choice in the lock",
    ],
    "record": [
        "Record the recovery in the ledger",
        "Mark the configuration rolled back from as rejected for this deployment",
        "Record in the lock that the ledger has the recovery",
        "Show Rules the ledger proposes",
    ],
    "redeploy": [
        "Stop when the GPUs could not be freed",
        "Stop when there is nothing left to try",
        "Redeploy on the next configuration and gate it",
        "Deploy it, recording a failed outcome too",
        "Rebuild the LaunchSpec with the chosen overrides",
        "Deploy the next configuration",
        "Record the failed outcome in the ledger",
        "Fail with the redeploy's error",
        "Record the outcome in the ledger",
        "Mark the host recovered",
        "Report the recovery",
    ],
}

# The end-to-end runs (tests/integration/test_recover.py) that exercise each stage.
STAGE_TESTS = {
    "evidence": ["test_incident_replayed_end_to_end_with_bystanders_spared",
                 "test_a_recovery_never_stops_a_server_restarted_after_it_was_judged"],
    "stop": ["test_orphaned_workers_are_found_and_killed",
             "test_aggressive_mode_never_crosses_into_another_deployment"],
    "choose": ["test_a_frozen_server_is_restarted_on_the_same_configuration",
               "test_a_failed_rank_takes_its_whole_multi_node_group_along"],
    "record": ["test_a_recovery_killed_after_its_stop_is_finished_by_the_next_run"],
    "redeploy": ["test_memory_never_released_marks_the_node_for_reboot",
                 "test_crash_loop_guard_stops_after_the_configured_attempts"],
}


def load(name: str) -> list[dict]:
    return yaml.safe_load((TASKS / name).read_text())


def flat(tasks: list[dict]) -> list[dict]:
    out = []
    for task in tasks:
        out.append(task)
        for part in ("block", "rescue", "always"):
            out.extend(flat(task.get(part) or []))
    return out


def names(tasks: list[dict]) -> list[str]:
    return [t["name"] for t in flat(tasks)]


def module_of(task: dict) -> str:
    return next((k for k in task if k.startswith(("sglang.fleet.", "ansible.builtin."))), "")


def lock_block() -> dict:
    (block,) = [t for t in load("recover.yml") if t.get("name") == LOCK_BLOCK]
    return block


def test_the_stages_are_imported_in_the_documented_order_inside_the_locks_block():
    block = lock_block()
    imported = [t["ansible.builtin.import_tasks"] for t in block["block"]]
    assert imported == [f"{stage}.yml" for stage in STAGES]
    # Static imports: each stage's tasks are this block's, with its variables, and no task
    # of recovery runs outside it once the lock is taken.
    assert all(set(t) == {"name", "ansible.builtin.import_tasks"} for t in block["block"])
    assert "rescue" not in block  # a stage's failure fails the host, after the release
    (release,) = block["always"]
    assert release["sglang.fleet.sglang_lock"] == {
        "from_spec": "{{ sglang_recover__failed_spec }}", "state": "released"}
    assert "taken_over" in release["when"] and "acquired" in release["when"]
    before = [t["name"] for t in load("recover.yml")]
    assert before.index("Take the lock of this deployment") == before.index(LOCK_BLOCK) - 1
    # The docs' table names every stage's file.
    doc = (REPO / "docs" / "recovery.md").read_text()
    for stage in STAGES:
        assert f"roles/sglang_recover/tasks/{stage}.yml" in doc


@pytest.mark.parametrize("stage", list(STAGES))
def test_each_stage_holds_its_own_tasks_and_an_end_to_end_run(stage):
    tasks = load(f"{stage}.yml")
    assert names(tasks) == STAGES[stage]
    assert len((TASKS / f"{stage}.yml").read_text().splitlines()) <= 150
    tests = {f.name for f in ast.parse((REPO / "tests" / "integration" / "test_recover.py")
                                       .read_text()).body if isinstance(f, ast.FunctionDef)}
    assert set(STAGE_TESTS[stage]) <= tests


def test_evidence_is_kept_before_anything_is_killed_and_a_restarted_server_is_left():
    tasks = {t["name"]: t for t in flat(load("evidence.yml"))}
    assert not any(module_of(t) in ("sglang.fleet.sglang_stop", "sglang.fleet.sglang_service")
                   for t in tasks.values())
    leave = tasks["Leave a server that another run restarted after it was judged"]
    assert module_of(leave) == "ansible.builtin.fail" and "not _resuming" in leave["when"]
    keep = tasks["Keep the evidence before anything is killed"]
    assert keep["sglang.fleet.sglang_evidence"]["from_spec"] == "{{ _spec }}"
    assert keep["when"] == "not _resuming"


def test_the_stop_is_recorded_in_the_lock_before_any_choice_and_a_resumed_run_skips_it():
    tasks = {t["name"]: t for t in flat(load("stop.yml"))}
    stop = tasks["Stop the deployment's processes and verify its GPUs free"]
    assert stop["when"] == "not _resuming"
    assert set(stop["sglang.fleet.sglang_stop"]) == {
        "from_spec", "hung", "term_timeout", "aggressive", "verify_timeout", "gpu_reset"}
    stopped = tasks["Record in the lock that the deployment is stopped"]
    assert stopped["sglang.fleet.sglang_lock"]["recovery"]["stage"] == "stopped"
    # After the steps a resumed run skipped: a skipped task still registers its variable.
    order = STAGES["stop"]
    assert order.index("Resume the recovery that a killed run left after its stop") > \
        order.index("Record in the lock that the deployment is stopped")


def test_the_choice_is_recorded_in_the_lock_and_a_resumed_run_keeps_its_own():
    tasks = {t["name"]: t for t in flat(load("choose.yml"))}
    choice = tasks["Choose the next configuration"]["ansible.builtin.set_fact"]
    assert "_resumed.next if _resumed.next is defined" in choice["sglang_recover_next"]
    assert "sglang_fleet_next_spec" in choice["sglang_recover_next"]
    chosen = tasks["Record the choice in the lock"]
    assert chosen["sglang.fleet.sglang_lock"]["recovery"]["stage"] == "chosen"


def test_the_ledger_is_written_once_and_the_lock_says_so():
    tasks = {t["name"]: t for t in flat(load("record.yml"))}
    entry = tasks["Record the recovery in the ledger"]
    assert entry["sglang.fleet.sglang_ledger"]["entry"]["kind"] == "recovery"
    recorded = tasks["Record in the lock that the ledger has the recovery"]
    assert recorded["sglang.fleet.sglang_lock"]["recovery"] == {"stage": "recorded"}
    for name in ("Record the recovery in the ledger",
                 "Record in the lock that the ledger has the recovery"):
        assert tasks[name]["when"] == "_resumed.stage | default('') != 'recorded'"


def test_no_redeploy_with_gpus_held_or_nothing_to_try_and_a_failed_one_is_recorded():
    tasks = load("redeploy.yml")
    held, none_left, redeploy = tasks
    assert held["when"] == "sglang_recover__stop.reboot_needed"
    assert none_left["when"] == "sglang_recover_next.source == 'none'"
    (deploy,) = [t for t in redeploy["block"] if "rescue" in t]
    rescued = [module_of(t) for t in deploy["rescue"]]
    assert rescued == ["sglang.fleet.sglang_ledger", "ansible.builtin.fail"]
    assert deploy["rescue"][0]["sglang.fleet.sglang_ledger"]["entry"]["kind"] == \
        "recovery_outcome"


def test_recovery_took_no_task_away_in_the_split():
    """Every task of the stages appears once, in stage order, between the lock and its
    release: the flattened role reads as the single file did."""
    expanded = []
    for t in flat(load("recover.yml")):
        target = t.get("ansible.builtin.import_tasks")
        expanded.extend(names(load(target)) if target else [t["name"]])
    stage_tasks = [n for stage in STAGES.values() for n in stage]
    assert expanded == ["Apply the crash-loop guard",
                        "Freeze the failed LaunchSpec and the lock owner (the redeploy "
                        "replaces the spec)",
                        "Take the lock of this deployment", LOCK_BLOCK, *stage_tasks,
                        "Release the lock"]
