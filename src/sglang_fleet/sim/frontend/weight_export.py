"""A seed's side of remote-instance weight loading: the HTTP endpoints a new server calls on the
running server it loads its weights from, as SGLang 0.5.23 answers them.

Modelled on sglang/srt/entrypoints/http_server.py (init_weights_send_group_for_remote_instance,
send_weights_to_remote_instance: {"success", "message"}, 200 or 400;
remote_instance_transfer_engine_info and its deprecated get_ alias), managers/io_struct.py
(InitWeightsSendGroupForRemoteInstanceReqInput, SendWeightsToRemoteInstanceReqInput) and
model_executor/model_runner_components/weight_exporter.py (WeightExporter: each TP rank takes
its port of the comma list, names its group `<group_name>_<port>_<tp_rank>`, logs "init custom
process group: ..." and becomes rank 0 of a two-rank group at tcp://<master_address>:<port>;
the tokenizer manager answers with TP rank 0's result).

Here each rank's group is torch's TCPStore as the simulator's rendezvous keeps it (a real TCP
port on the seed's address, which the new server's rank joins), and the broadcast of the
parameters is SIMULATED: the seed writes one line per weight shard of its profile down the
group's connection. No GPU memory moves.
Differences from 0.5.23: a port list of the wrong length, or a send to a group never
initialised, trips an assertion or a KeyError in the real seed's scheduler (taking the seed
down); the simulator answers 400 with the message instead. The controller refuses the first
before any node is touched (sglang_fleet.launch.seed).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from sglang_fleet.sim.engine import rendezvous
from sglang_fleet.sim.engine.runtime import SimRuntime, log

INIT_PATH = "/init_weights_send_group_for_remote_instance"
SEND_PATH = "/send_weights_to_remote_instance"
TE_INFO_PATHS = ("/remote_instance_transfer_engine_info",
                 "/get_remote_instance_transfer_engine_info")
# torch distributed_c10d default_pg_timeout: init_custom_process_group's, with timeout=None.
DEFAULT_PG_TIMEOUT_S = 1800
# io_struct.py: the fields without a default, per request.
_REQUIRED = {INIT_PATH: ("master_address", "ports", "group_rank", "world_size"),
             SEND_PATH: ("master_address", "ports")}


def missing_field(path: str, body: Any) -> dict[str, Any] | None:
    """FastAPI's validation error for a body that lacks a required field, or None."""
    if not isinstance(body, dict):
        return {"type": "model_attributes_type", "loc": ("body",),
                "msg": "Input should be a valid dictionary or object to extract fields from",
                "input": body}
    for name in _REQUIRED[path]:
        if name not in body:
            return {"type": "missing", "loc": ("body", name), "msg": "Field required",
                    "input": body}
    return None


class WeightExporter:
    """The seed's weight-send groups, one per TP rank of this node and client."""

    def __init__(self, rt: SimRuntime):
        self.rt = rt
        self.groups: dict[str, rendezvous.Store] = {}
        # Each rank's group being built: a real seed rank takes the send request only after
        # its init (one scheduler event loop), however early the new server's rank 0 sends it.
        self.building: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def _ranks(self) -> list[Any]:
        return [r for r in self.rt.topology.schedulers(None) if r.pp_rank == 0]

    def _rank_port(self, ports: str, tp_rank: int) -> tuple[str | None, str]:
        ports_list = str(ports).split(",")
        tp = self.rt.topology.tp
        if len(ports_list) != tp:
            return None, f"Expected {tp} ports, but got {len(ports_list)} ports."
        return ports_list[tp_rank], ""

    def init_group(self, body: dict[str, Any]) -> tuple[bool, str]:
        results: dict[int, tuple[bool, str]] = {}
        threads = [threading.Thread(target=self._init_rank, args=(rank, body, results))
                   for rank in self._ranks()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results[min(results)]

    def _init_rank(self, rank: Any, body: dict[str, Any],
                   results: dict[int, tuple[bool, str]]) -> None:
        port, problem = self._rank_port(body["ports"], rank.tp_rank)
        if port is None:
            results[rank.tp_rank] = (False, problem)
            return
        name = f"{body.get('group_name', 'weight_send_group')}_{port}_{rank.tp_rank}"
        address = body["master_address"]
        log(f"init custom process group: tp_rank={rank.tp_rank}, gpu_id={rank.gpu_id}, "
            f"master_address={address}, master_port={port}, "
            f"group_rank={body['group_rank']}, world_size={body['world_size']}, "
            f"group_name={name}, backend={body.get('backend', 'nccl')}", rank.prefix)
        with self.lock:
            old = self.groups.pop(name, None)
            built = self.building[name] = threading.Event()
        if old is not None:
            with contextlib.suppress(OSError):
                old.server.close()
        try:
            store = rendezvous.Store(address, int(port), int(body["world_size"]))
            store.wait_for_workers(DEFAULT_PG_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - WeightExporter reports any failure
            message = f"Failed to init group: {exc}."
            log(message, rank.prefix)
            results[rank.tp_rank] = (False, message)
            built.set()
            return
        with self.lock:
            self.groups[name] = store
        built.set()
        results[rank.tp_rank] = (True, f"Succeeded to init group through {address}:{port} "
                                       "group.")

    def send_weights(self, body: dict[str, Any]) -> tuple[bool, str]:
        results: dict[int, tuple[bool, str]] = {}
        for rank in self._ranks():
            results[rank.tp_rank] = self._send_rank(rank, body)
        return results[min(results)]

    def _send_rank(self, rank: Any, body: dict[str, Any]) -> tuple[bool, str]:
        port, problem = self._rank_port(body["ports"], rank.tp_rank)
        if port is None:
            return False, problem
        name = f"{body.get('group_name', 'weight_send_group')}_{port}_{rank.tp_rank}"
        with self.lock:
            built = self.building.get(name)
        if built is not None:
            built.wait()
        with self.lock:
            store = self.groups.get(name)
        if store is None:
            message = (f"Group {name} not in _weights_send_group list. Please call "
                       "`init_weights_send_group_for_remote_instance` first.")
            log(message, rank.prefix)
            return False, message
        shards = int(self.rt.profile["weight_shards"])
        # SIMULATED broadcast of every parameter: one line per weight shard.
        payload = f"weights {shards}\n" + "".join(f"shard {i}\n" for i in range(1, shards + 1))
        try:
            for client in list(store.clients):
                client.sendall((payload + "end\n").encode())
        except OSError as exc:
            message = f"Failed to send weights: {exc}."
            log(message, rank.prefix)
            return False, message
        return True, (f"Succeeded to send weights through {body['master_address']}:{port} "
                      f"{name}.")

    @staticmethod
    def transfer_engine_info(rank: Any) -> tuple[int, dict[str, Any]]:
        """The seed's Mooncake session and weights' memory: none here (no transfer engine on
        a simulated node), so http_server.py's failure answer."""
        if rank is None or rank < 0:
            return 400, {"error": {"message": "Missing or invalid rank parameter"}}
        return 400, {"error": {"message": f"Failed to get transfer engine info for rank {rank}"}}
