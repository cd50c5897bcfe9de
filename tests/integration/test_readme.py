"""Every command in the README, run as a reader runs it, in the README's order, against a
simulated fleet of this test (two nodes and the real router on free ports, its own stores):
the README's commands keep working, and the README keeps only commands that work.

How each is run:
- `.venv/bin/X` runs this environment's X from the repository root; `ansible-playbook` and
  `sglang-fleet` get the test fleet's inventory and extra variables unless the command names an
  inventory of its own;
- a command on the example inventories of real nodes (`-i inventory/examples/...`) runs up to
  what needs no node: `sglang-fleet check` itself, and a deploy's validation play;
- `curl` asks the test fleet's router instead of port 30000;
- `export` sets the variable for the commands after it;
- `./bootstrap` and `.venv/bin/pytest` are what CI runs (`.ci/run`), checked to be there;
- the install of the collection from a clone (`/path/to/sglang-fleet`) installs this checkout
  into a collections path of the test's; `pip install` of the checkout is what `./bootstrap`
  does, checked to be there.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess

import pytest
import yaml

from sglang_fleet.testfleet.local import BIN, REPO, ansible_env, make_fleet
from sglang_fleet.testfleet.router import router_venv

pytestmark = pytest.mark.integration

README = REPO / "README.md"
# Commands expected to exit non-zero, by a word they hold: a log with a fatal failure, a fault.
EXPECTED_TO_FAIL = ("diagnose", "sim_fault=crash")


def readme_commands() -> list[str]:
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()  # comments after a command
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def _with_fleet(words: list[str], fleet, extra: str) -> list[str]:
    """A command of the README on the test fleet: its inventory and extra variables."""
    if "-i" in words:
        return words
    tool = os.path.basename(words[0])
    if tool == "ansible-playbook":
        return words + ["-i", str(fleet.inventory), "-e", extra]
    sub = words[1] if len(words) > 1 else ""
    if tool == "sglang-fleet" and sub != "diagnose":
        return words[:2] + ["-i", str(fleet.inventory), "-e", extra] + words[2:]
    return words


def _on_real_nodes(words: list[str]) -> list[str]:
    """What of a real-node command runs without the nodes: a deploy's validation play."""
    if os.path.basename(words[0]) == "ansible-playbook" and "deploy.yml" in words:
        return [w if w != "deploy.yml" else "playbooks/validate.yml" for w in words]
    return words


def _run(command: str, fleet, extra: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    words = shlex.split(command.replace(".venv/bin/", str(BIN) + "/"))
    if words[0] == "curl":
        words = [w.replace("http://127.0.0.1:30000", fleet.router_url) for w in words]
    elif "-i" in words and "inventory/examples/" in words[words.index("-i") + 1]:
        words = _on_real_nodes(words)
    else:
        words = _with_fleet(words, fleet, extra)
    return subprocess.run(words, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)


CLONE = "/path/to/sglang-fleet"


def _install_from_clone(command: str, collections) -> None:
    """The README's install of the collection, from this checkout into `collections`."""
    words = shlex.split(command.replace(CLONE, str(REPO)))
    if words[0] == "pip":
        assert words[-1] == str(REPO) and "pip install" in (REPO / "bootstrap").read_text()
        return
    env = {k: v for k, v in ansible_env().items() if k != "ANSIBLE_CONFIG"}
    proc = subprocess.run([str(BIN / words[0]), *words[1:], "-p", str(collections)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (command, proc.stdout[-2000:], proc.stderr[-2000:])
    assert (collections / "ansible_collections" / "sglang" / "fleet" / "galaxy.yml").exists() \
        or (collections / "ansible_collections" / "sglang" / "fleet" / "MANIFEST.json").exists()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The default fleet: four simulated nodes and the real router."""
    tmp = tmp_path_factory.mktemp("readme")
    fleet = make_fleet(tmp, hosts=4, time_factor=0.005,
                       router=router_venv(tmp_path_factory.getbasetemp().parent))
    yield fleet
    fleet.kill_leftovers()


def test_a_first_deploy_and_a_rerun_say_little(fleet):
    """Without -v a deploy says what each node will do (NODE), where each server is (GATE, on
    a change of phase or progress), the ready and router lines and the recap: under 60 lines
    for a first deploy of the default fleet, under 20 for a re-run that changes nothing."""
    first = fleet.deploy()
    assert first.rc == 0, first.output[-3000:]
    lines = first.output.strip().splitlines()
    assert len(lines) < 60, first.output
    assert not [x for x in lines if x.startswith(("TASK [", "PLAY [", "skipping:",
                                                   "included:", "changed:"))]
    assert sum(x.startswith("NODE [") for x in lines) == 4
    assert sum(": ready at http" in x for x in lines) == 4
    again = fleet.deploy()
    assert again.rc == 0 and again.changed_hosts() == set(), again.output[-3000:]
    assert len(again.output.strip().splitlines()) < 20, again.output


def test_every_command_of_the_readme_runs(fleet):
    commands = readme_commands()
    assert len(commands) >= 15, commands
    extra = json.dumps(fleet.extra)
    env = dict(ansible_env(), SGLANG_FLEET_STATE_DIR=str(fleet.root.parent / "state"))
    ran = []
    for command in commands:
        if command.startswith("./bootstrap") or "/pytest" in command:
            ci = (REPO / ".ci" / "run").read_text()
            parts = [part.strip() for part in command.split("&&")]
            for part in parts:
                if part.startswith("./bootstrap") or "/pytest" in part:
                    assert part.split()[0] in ci or part.endswith("pytest tests/unit"), part
            rest = [part for part in parts if "ansible-playbook" in part]
            if not rest:
                continue
            command = rest[0]
        if command.startswith(("ansible-galaxy collection install", "pip install")):
            _install_from_clone(command, fleet.root.parent / "collections")
            continue
        if command.startswith("export "):
            name, _, value = command.removeprefix("export ").partition("=")
            env[name] = subprocess.run(["bash", "-c", f"echo {value}"], capture_output=True,
                                       text=True, check=True).stdout.strip()
            continue
        proc = _run(command, fleet, extra, env)
        ran.append(command)
        if any(word in command for word in EXPECTED_TO_FAIL):
            assert proc.returncode != 0, (command, proc.stdout[-3000:])
        else:
            assert proc.returncode == 0, (command, proc.stdout[-3000:])
        if command.startswith("curl"):
            assert json.loads(proc.stdout)["meta_info"]["completion_tokens"] == 8
    assert len(ran) >= 12


def test_the_readme_stays_an_operators_page():
    text = README.read_text()
    assert len(text.splitlines()) < 600
    for history in ("issue ", "this session", "when this work", "fresh-clone", "no longer"):
        assert history not in text.lower(), history
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).is_file(), link
    # The variables the README names are the role's.
    defaults = yaml.safe_load((REPO / "roles/sglang_server/defaults/main.yml").read_text())
    for name in set(re.findall(r"\b(sglang_server_[a-z_]+[a-z])\b", text)):
        assert name in defaults or name in ("sglang_server_launch_spec",), name


def test_every_relative_link_and_image_of_the_docs_resolves():
    """A link or image in docs/*.md is relative to docs/, as a Markdown viewer reads it."""
    broken = []
    for page in sorted((REPO / "docs").glob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.name}: {target}")
    assert not broken, broken
