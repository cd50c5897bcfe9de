"""A new server's side of remote-instance weight loading (--load-format remote_instance): it
calls its seed's HTTP endpoints and takes its weights from the seed instead of its own files.

Modelled on SGLang 0.5.23's arg_groups/model_path_hook.py (_handle_load_format: incomplete
settings, or a transfer_engine backend without Mooncake, fall back to loading from disk with a
warning), model_executor/model_runner_components/load_model_utils.py
(maybe_trigger_remote_instance_nccl_send_group: TP rank 0 posts
/init_weights_send_group_for_remote_instance in a thread), model_loader/
remote_instance_weight_loader_utils.py (the two requests, their bodies and error lines),
model_loader/loader.py (RemoteInstanceModelLoader.load_model and
load_model_from_remote_instance_by_nccl: "Loading weights from remote instance ...", each rank
joins the seed's two-rank group at tcp://<seed ip>:<its port>, TP rank 0 then posts
/send_weights_to_remote_instance and every rank receives the broadcast) and
connector/remote_instance.py (build_group's log line; a group that cannot be built is logged
and the load then fails on the missing `_model_update_group`).

The requests and the group's TCP rendezvous are real; the transfer of the parameters is
SIMULATED (the seed sends one line per weight shard, and each takes the profile's load time of
a shard). A seed that never answers leaves the rank waiting in the group's rendezvous for
torch's default process-group timeout (30 minutes), as in SGLang.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from json import dumps
from typing import Any

from sglang_fleet.sim.engine import failures, rendezvous
from sglang_fleet.sim.engine.runtime import log

LOAD_FORMAT = "remote_instance"
DEFAULT_PG_TIMEOUT_S = 1800  # torch distributed_c10d default_pg_timeout


def effective_load_format(args: Any, version: str, prefix: str, quiet: bool = False) -> str:
    """The load format after the release's hook: remote_instance only with complete settings
    (and, for transfer_engine, Mooncake, which no simulated node has). The hook runs once per
    server: `quiet` on all ranks but one."""
    if getattr(args, "load_format", None) != LOAD_FORMAT:
        return str(getattr(args, "load_format", "auto"))
    backend = getattr(args, "remote_instance_weight_loader_backend", None) or "nccl"
    ip = getattr(args, "remote_instance_weight_loader_seed_instance_ip", None)
    port = getattr(args, "remote_instance_weight_loader_seed_instance_service_port", None)
    ports = getattr(args, "remote_instance_weight_loader_send_weights_group_ports", None)
    warning = None
    if ip is None or port is None:
        warning = ("Fallback load_format to 'auto' due to incomplete remote instance weight "
                   "loader settings.")
    elif ports is None and backend == "nccl":
        warning = ("Fallback load_format to 'auto' due to incomplete remote instance weight "
                   "loader NCCL group ports settings.")
    elif backend == "transfer_engine":
        if not quiet:
            log("Failed to import mooncake.engine. Does not support using TransferEngine as remote "
                "instance weight loader backend.", prefix)
        warning = ("Fallback load_format to 'auto' due to 'transfer_engine' backend is not "
                   "supported.")
    if warning is None:
        return LOAD_FORMAT
    if not quiet and not version.startswith("0.5.4"):  # 0.5.4.post3 falls back silently
        log(warning, prefix)
    return "auto"


def instance_ip() -> str:
    """NetworkAddress.resolve_host(socket.gethostname()): this node's own address."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _post(url: str, json: dict[str, Any]) -> None:  # noqa: A002 - requests.post's keyword
    # requests.post without a timeout, whose status nobody reads (as in SGLang).
    request = urllib.request.Request(url, data=dumps(json).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request) as response:  # noqa: S310 - the seed's URL
            response.read()
    except urllib.error.HTTPError as exc:
        exc.read()


def _seed(args: Any) -> tuple[str, int, list[int]]:
    return (args.remote_instance_weight_loader_seed_instance_ip,
            int(args.remote_instance_weight_loader_seed_instance_service_port),
            list(args.remote_instance_weight_loader_send_weights_group_ports or []))


def trigger_init_weights_send_group_for_remote_instance_request(args: Any, client_id: str,
                                                                prefix: str) -> None:
    ip, port, ports = _seed(args)
    url = f"http://{ip}:{port}"
    try:
        _post(f"{url}/init_weights_send_group_for_remote_instance",
              json={"master_address": ip, "ports": ",".join(str(p) for p in ports),
               "group_rank": 0, "world_size": 2, "group_name": f"send_weights_{client_id}",
               "backend": "nccl"})
    except Exception as e:
        log("Failed to trigger init_weights_send_group_for_remote_instance_request to seed "
            f"instance {url}: {e}.", prefix)
        raise


def trigger_transferring_weights_request(args: Any, client_id: str, prefix: str) -> None:
    ip, port, ports = _seed(args)
    try:
        _post(f"http://{ip}:{port}/send_weights_to_remote_instance",
              json={"master_address": ip, "ports": ",".join(str(p) for p in ports),
               "group_name": f"send_weights_{client_id}"})
    except Exception as e:
        log(f"Failed to trigger send weights to remote instance request: {e}", prefix)
        raise


def _thread(target: Any, *args: Any) -> None:
    threading.Thread(target=target, args=args, name=f"Thread ({target.__name__})").start()


def load_model_from_remote_instance(args: Any, tp_rank: int, prefix: str,
                                    per_shard_s: float) -> int:
    """Every rank's load from the seed; returns the shards received. TP rank 0 posts both
    requests, each in a thread of its own as SGLang does."""
    client_id = instance_ip()
    if tp_rank == 0:
        _thread(trigger_init_weights_send_group_for_remote_instance_request, args, client_id,
                prefix)
    log("Loading weights from remote instance ...", prefix)
    ip, _, ports = _seed(args)
    port = ports[tp_rank]
    log(f"init custom process group: master_address={ip}, master_port={port}, "
        f"rank_offset=1, world_size=2, group_name=send_weights_{client_id}_{port}_{tp_rank}, "
        "backend=nccl", prefix)
    try:
        group = rendezvous.join(ip, port, 1, DEFAULT_PG_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - build_group logs any failure and goes on
        log(f"Failed to initialize custom process group: {e}.", prefix)
        raise failures.sglang_error(
            "AttributeError", failures.REMOTE_INSTANCE_FRAMES,
            "'RemoteInstanceConnector' object has no attribute '_model_update_group'") from None
    if tp_rank == 0:
        _thread(trigger_transferring_weights_request, args, client_id, prefix)
    received, ended = 0, False
    with group.makefile("r") as broadcast:
        for line in broadcast:
            if line.startswith("shard"):
                time.sleep(per_shard_s)  # SIMULATED: the shard's parameters over NCCL
                received += 1
            elif line.startswith("end"):
                ended = True
                break
    group.close()  # destroy_process_group after loading
    if not ended:
        raise ConnectionError(f"the seed's group at {ip}:{port} closed after {received} "
                              "shards (simulated broadcast)")
    return received
