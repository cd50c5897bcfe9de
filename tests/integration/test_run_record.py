"""The run record of a real simulated deploy, opened in headless Chromium: a deploy in which one
server hangs in CUDA graph capture (flashinfer MLA attention on SM120) and is recovered onto
its last good configuration. The page shows the failed host's row, its verdict, its evidence
and what changed; it logs no console error and makes no network request."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sglang_fleet.testfleet.local import FAST_GATE, make_fleet, sglang_fleet

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Headless, offline and fresh: nothing of the machine's own browser profile, no update or
# sync traffic that would look like the page's own requests.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"]
INCIDENT = {"sglang_server_attention_backend": "flashinfer",
            "sglang_server_allow_rules": ["flashinfer-mla-sm120-graph-capture-hang"]}


@pytest.fixture(scope="module")
def recovered_run(tmp_path_factory):
    """A two-node fleet deployed ready once (the ledger's last good runs), then deployed with
    the incident's setting on sim-node-2 and --recover: the run's folder."""
    tmp = tmp_path_factory.mktemp("run-record")
    fleet = make_fleet(tmp, hosts=2, time_factor=0.005)
    extra = json.dumps(fleet.with_stores(**FAST_GATE))
    try:
        first = sglang_fleet("deploy", "-i", str(fleet.inventory), "-e", extra,
                             "--run-dir", str(tmp / "first"))
        assert first.returncode == 0, first.stdout[-3000:]
        fleet.set_host_vars("sim-node-2", INCIDENT)
        run_dir = tmp / "incident"
        proc = sglang_fleet("deploy", "-i", str(fleet.inventory), "-e", extra, "--recover",
                            "--run-dir", str(run_dir))
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert f", page {run_dir / 'run.html'}" in proc.stdout.splitlines()[-1]
        yield run_dir
    finally:
        fleet.kill_leftovers()


def test_the_record_names_the_recovery_and_what_changed(recovered_run):
    record = json.loads((recovered_run / "run.json").read_text())
    assert record["fleet"]["line"].startswith("Serving: 2 of 2 servers ready (1 recovered)")
    two = record["servers"][0]
    assert two["host"] == "sim-node-2" and two["recovered"]
    assert two["failed_verdict"].startswith("stalled in capturing_cuda_graph")
    assert two["cause"] == "configuration" and "attention_backend" in two["fix"]
    files = {f["name"]: recovered_run / f["href"] for f in two["evidence"]["files"]}
    assert files["log_tail.txt"].is_file() and any(n.startswith("py-spy") for n in files)
    changed = [s for c in record["changes"] if c["host"] == "sim-node-2" for s in c["settings"]]
    assert {"name": "sglang_server_attention_backend", "old": "triton", "new": "flashinfer",
            "secret": False} in changed
    kinds = {a["kind"] for a in record["actions"] if a["host"] == "sim-node-2"}
    assert {"kill", "rollback"} <= kinds
    phases = [p["phase"] for p in two["timeline"]]
    for phase in ("validated", "loading_weights", "capturing_cuda_graph", "stalled", "killed",
                  "ready"):
        assert phase in phases, phases


def test_report_prints_the_page_and_rebuilds_it_from_the_runs_files(recovered_run):
    page = recovered_run / "run.html"
    shown = sglang_fleet("report", str(recovered_run))
    assert shown.returncode == 0 and shown.stdout.strip() == str(page)
    before = json.loads((recovered_run / "run.json").read_text())
    page.unlink()
    rebuilt = sglang_fleet("report", str(recovered_run))
    assert rebuilt.returncode == 0 and page.is_file()
    after = json.loads((recovered_run / "run.json").read_text())
    assert after["servers"] == before["servers"] and after["changes"] == before["changes"]


def test_the_page_in_headless_chromium(recovered_run, tmp_path, capsys):
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).is_file():
        pytest.skip("no chromium: ./bootstrap --test-fleet installs Debian's package")
    page_path = recovered_run / "run.html"
    shot = tmp_path / "run-record.png"
    requests, errors, dialogs = [], [], []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1280, "height": 900})
        try:
            browser.on("request", lambda r: requests.append(r.url))
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(page_path.as_uri())
            row = page.locator('details.server[data-host="sim-node-2"]')
            assert row.is_visible()
            assert "recovered from stalled in capturing_cuda_graph" in row.locator(
                "summary").inner_text()
            assert row.get_by_text("stalled in capturing_cuda_graph", exact=False).first \
                .is_visible()
            link = row.locator('a:text-is("log_tail.txt")')
            assert link.is_visible()
            assert (recovered_run / link.get_attribute("href")).is_file()
            change = page.locator("#changes tr.change", has_text="sglang_server_attention_backend")
            assert change.first.is_visible() and "flashinfer" in change.first.inner_text()
            assert page.locator("#fleet").inner_text().startswith("Serving: 2 of 2")
            # The filter: a verdict hides the other rows.
            page.select_option("#verdict", "ready")
            page.fill("#q", "sim-node-1")
            assert not row.is_visible()
            assert page.locator('details.server[data-host="sim-node-1"]').is_visible()
            page.select_option("#verdict", "")
            page.fill("#q", "")
            assert row.is_visible() and row.get_attribute("open") is not None
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    with capsys.disabled():
        print(f"\nrun record screenshot: {shot}")
    assert errors == [] and dialogs == []
    assert requests == [page_path.as_uri()], requests


def read_texts(paths) -> list[str]:
    """The texts of the files that still exist when read."""
    texts = []
    for path in paths:
        try:
            texts.append(path.read_text())
        except FileNotFoundError:
            continue
    return texts


def test_a_cli_run_killed_midway_gets_a_page_that_says_so(tmp_path):
    """SIGKILL to sglang-fleet while the gate watches a loading server: no summary is
    written; `report RUN` writes the page from the runner's events, each host as last seen."""
    import os
    import signal
    import subprocess

    from sglang_fleet.node.process import procs
    from sglang_fleet.testfleet.local import BIN, REPO, ansible_env, wait_for

    fleet = make_fleet(tmp_path, hosts=1, time_factor=0.05)
    run_dir = tmp_path / "killed"
    cli = subprocess.Popen(
        [str(BIN / "sglang-fleet"), "deploy", "-i", str(fleet.inventory), "--run-dir",
         str(run_dir), "-e", json.dumps(fleet.with_stores())], cwd=REPO, env=ansible_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        def gating() -> bool:
            # ansible-runner renames an event's -partial.json as it completes it: a file
            # globbed may be gone when read.
            return any('"runner_retry"' in text
                       for text in read_texts(run_dir.glob("runner/artifacts/*/job_events/*.json")))
        wait_for(gating, timeout=300, interval=0.5)
        os.kill(cli.pid, signal.SIGKILL)
        cli.wait()
        # ansible-playbook ends with the CLI (SIGTERM on its parent's death).
        wait_for(lambda: not [p for p in procs.all_pids() if str(fleet.inventory) in (
            (procs.process_info(p) or {}).get("cmdline") or "")], timeout=120)
    finally:
        if cli.poll() is None:
            os.kill(cli.pid, signal.SIGKILL)
            cli.wait()
        fleet.kill_leftovers()
    assert not (run_dir / "summary.json").exists() and not (run_dir / "run.html").exists()
    shown = sglang_fleet("report", str(run_dir))
    assert shown.returncode == 0 and shown.stdout.strip() == str(run_dir / "run.html")
    record = json.loads((run_dir / "run.json").read_text())
    assert record["run"]["ended"] == "ended before its recap"
    assert record["fleet"]["line"].startswith("NOT serving: 0 of 1 servers ready")
    (server,) = record["servers"]
    assert server["status"] == "not observed" and server["verdict"] == "progressing"
    assert "ended before Ansible's recap" in (run_dir / "run.html").read_text().replace(
        "&#x27;", "'")
