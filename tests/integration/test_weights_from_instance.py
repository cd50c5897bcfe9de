"""Weights from a running instance through real ansible-playbook runs on the simulated fleet:
sim-node-1 serves; sim-node-2 is deployed with sim-node-1 as its seed
(sglang_server_weights_from_instance) and loads its weights from it through the HTTP handshake
of SGLang 0.5.23's remote-instance loader (the GPU-to-GPU broadcast itself is simulated); with
the seed down, sim-node-2's deploy fails naming the seed, and its running server is left as it
was. The simulator's two sides are also checked directly, without Ansible."""

from __future__ import annotations

import json
import re

import pytest

from sglang_fleet.testfleet.local import (
    free_port_block,
    http_status,
    make_fleet,
    start_sim,
    wait_for,
)

pytestmark = pytest.mark.integration

SEED, NEW = "sim-node-1", "sim-node-2"
INIT = "POST /init_weights_send_group_for_remote_instance HTTP/1.1\" 200"
SEND = "POST /send_weights_to_remote_instance HTTP/1.1\" 200"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = make_fleet(tmp_path_factory.mktemp("weights-from-instance"), hosts=2)
    yield fleet
    fleet.stop()
    fleet.kill_leftovers()


def _read(path):
    return path.read_bytes().decode(errors="replace") if path.exists() else ""


def test_a_seed_outside_the_inventory_is_refused_before_any_node_is_touched(fleet):
    run = fleet.deploy("--limit", NEW, extra={
        "sglang_server_weights_from_instance": "sim-node-9",
        "sglang_server_weights_from_instance_ports": list(range(30100, 30108))})
    assert run.rc != 0
    assert ("sglang_server_weights_from_instance='sim-node-9': is not a host of this "
            "inventory") in run.output, run.output[-3000:]
    assert fleet.main_pid(NEW) is None
    assert not fleet.log_file(NEW).exists()


def test_a_server_loads_its_weights_from_a_running_seed_of_its_deployment(fleet):
    run = fleet.deploy("--limit", SEED)
    assert run.rc == 0, run.output[-4000:]
    assert INIT not in _read(fleet.log_file(SEED))
    base = free_port_block(8)
    ports = list(range(base, base + 8))
    fleet.set_host_vars(NEW, {"sglang_server_weights_from_instance": SEED,
                              "sglang_server_weights_from_instance_ports": ports})
    run = fleet.deploy("--limit", NEW)
    assert run.rc == 0, run.output[-4000:]
    assert re.search(rf"GATE \[{NEW}\]: ready", run.output), run.output[-4000:]
    new_log = _read(fleet.log_file(NEW))
    assert "Loading weights from remote instance ..." in new_log
    assert (f"init custom process group: master_address=127.0.0.1, master_port={ports[0]}, "
            "rank_offset=1, world_size=2") in new_log
    assert "Multi-thread loading shards" not in new_log  # nothing read from its own files
    seed_log = _read(fleet.log_file(SEED))
    assert INIT in seed_log and SEND in seed_log, seed_log[-3000:]
    for rank, port in enumerate(ports):
        assert f"tp_rank={rank}, gpu_id={rank}, master_address=127.0.0.1, master_port={port}," \
            in seed_log
    info = json.loads(_get(fleet.url(NEW) + "/server_info"))
    assert info["load_format"] == "remote_instance"
    assert info["remote_instance_weight_loader_seed_instance_service_port"] == fleet.port(SEED)


def test_with_its_seed_down_the_deploy_fails_naming_the_seed_and_keeps_the_server(fleet):
    pid = fleet.main_pid(NEW)
    assert pid, "the first test leaves sim-node-2 serving"
    run = fleet.stop("--limit", SEED)
    assert run.rc == 0, run.output[-4000:]
    run = fleet.deploy("--limit", NEW)
    assert run.rc != 0
    assert NEW in run.failed_hosts()
    assert (f"sglang_server_weights_from_instance={SEED}: the seed's server at "
            f"http://127.0.0.1:{fleet.port(SEED)} does not serve") in run.output, \
        run.output[-4000:]
    assert f"deploy and start {SEED} first" in run.output
    assert fleet.main_pid(NEW) == pid
    assert http_status(fleet.url(NEW) + "/health") == 200


def test_the_simulated_seed_and_loader_speak_the_release_s_handshake(tmp_path):
    """Both sides without Ansible, at TP 2: each rank's group meets on its own port of the
    seed; a body the seed cannot read is refused as FastAPI refuses it."""
    seed = start_sim(tmp_path / "seed", "--tp-size", "2", "--disable-custom-all-reduce", gpus=2)
    new = None
    try:
        wait_for(lambda: http_status(seed.url + "/health") == 200, timeout=120)
        assert _post_status(seed.url + "/init_weights_send_group_for_remote_instance",
                            {"ports": "1,2"}) == 400
        assert _post_status(seed.url + "/remote_instance_transfer_engine_info", {}) == 405
        assert http_status(seed.url + "/remote_instance_transfer_engine_info?rank=0") == 400
        base = free_port_block(2)
        new = start_sim(tmp_path / "new", "--tp-size", "2", "--disable-custom-all-reduce",
                        "--load-format", "remote_instance",
                        "--remote-instance-weight-loader-seed-instance-ip", "127.0.0.1",
                        "--remote-instance-weight-loader-seed-instance-service-port",
                        str(seed.port),
                        "--remote-instance-weight-loader-send-weights-group-ports",
                        f"[{base},{base + 1}]", gpus=2)
        wait_for(lambda: http_status(new.url + "/health") == 200, timeout=120)
        for rank in (0, 1):
            assert f"TP{rank}] init custom process group: master_address=127.0.0.1, " \
                f"master_port={base + rank}, rank_offset=1" in new.log()
        assert INIT in seed.log() and SEND in seed.log()
    finally:
        seed.stop()
        if new is not None:
            new.stop()


def _get(url):
    import urllib.request
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def _post_status(url, body):
    import urllib.error
    import urllib.request
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
