import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


import pytest  # noqa: E402


@pytest.fixture
def one_node(tmp_path):
    """A one-node simulated fleet, stopped and swept after the test."""
    from helpers import make_fleet, run_playbook
    fleet = make_fleet(tmp_path, hosts=1)
    yield fleet
    run_playbook("playbooks/stop.yml", fleet.inventory, fleet.extra)
    fleet.kill_leftovers()
