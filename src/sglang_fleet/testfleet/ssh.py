"""A simulated fleet reached over real SSH: one sshd per node, started by the tests, each on
its own loopback address (127.0.0.11, .12, ...) and port, with a non-root login user that
becomes root through sudo, so that the transport, privilege escalation, file permissions and
pipelining are the real ones. Needs root (to run sshd and create the user), openssh-server and
sudo; ./bootstrap installs the packages."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sglang_fleet.testfleet.local import (
    REPO,
    SimFleet,
    free_port_block,
    own_stores,
    tp_settings,
    wait_for,
)

LOGIN_USER = "sglfleet"
SUDOERS = Path("/etc/sudoers.d/sglang-fleet-tests")
SSHD = Path("/usr/sbin/sshd")


def unavailable() -> str | None:
    """Why an SSH fleet cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root to run sshd and create the login user"
    if not SSHD.exists() or not shutil.which("sudo"):
        return "needs openssh-server and sudo (./bootstrap --test-fleet installs them)"
    return None


def ensure_login_user() -> None:
    """The non-root user Ansible logs in as; sudo without a password, as on a fleet. Under a
    lock: the SSH and systemd test fleets may set it up at once (parallel test workers)."""
    Path("/run/lock").mkdir(parents=True, exist_ok=True)
    with open("/run/lock/sglang-fleet-tests-user.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if subprocess.run(["id", LOGIN_USER], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", LOGIN_USER],
                           check=True)
        # No password, but not a locked account: sshd (without PAM) refuses locked ones.
        subprocess.run(["usermod", "-p", "*", LOGIN_USER], check=True)
        if not SUDOERS.exists():
            SUDOERS.write_text(f"{LOGIN_USER} ALL=(ALL) NOPASSWD: ALL\n")
            SUDOERS.chmod(0o440)
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation folder


@dataclass
class SshNode:
    host: str
    address: str
    port: int
    config: Path
    log: Path
    proc: subprocess.Popen | None = None


@dataclass
class SshFleet(SimFleet):
    nodes: dict[str, SshNode] = field(default_factory=dict)
    public_dir: Path | None = None

    def start_sshd(self, host: str) -> None:
        node = self.nodes[host]
        with open(node.log, "ab") as log:
            node.proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(node.config)],
                                         stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: _listening(node.address, node.port), timeout=15)

    def stop_sshd(self, host: str) -> None:
        """The node becomes unreachable: its sshd (started by this fleet) ends."""
        node = self.nodes[host]
        if node.proc and node.proc.poll() is None:
            node.proc.send_signal(signal.SIGTERM)
            node.proc.wait(10)

    def close(self) -> None:
        self.close_connections()
        for host in self.nodes:
            self.stop_sshd(host)
        if self.public_dir:
            shutil.rmtree(self.public_dir, ignore_errors=True)

    def close_connections(self) -> None:
        """End the SSH connection-sharing masters Ansible left for this fleet (ControlPersist
        keeps them for minutes), by their control sockets: ours, and nobody else's."""
        folder = control_dir(self.public_dir) if self.public_dir else None
        for sock in folder.glob("*") if folder and folder.is_dir() else ():
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "fleet-node"],
                           capture_output=True, timeout=15)


def _listening(address: str, port: int) -> bool:
    import socket
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((address, port)) == 0


def make_ssh_fleet(tmp: Path, hosts: int = 3, time_factor: float = 0.005,
                   tp: int | None = None) -> SshFleet:
    """Copy the default inventory, then reach each node over its own sshd."""
    # sshd reads the authorized keys as the login user, who cannot enter root's temp folders.
    public = Path(tempfile.mkdtemp(prefix="sglang-fleet-ssh-keys-"))
    fleet = ssh_fleet_layout(tmp, [f"ssh-node-{i}" for i in range(1, hosts + 1)],
                             keys=tmp / "ssh", public=public, nodes_root=tmp / "nodes",
                             time_factor=time_factor, tp=tp)
    try:
        for name in fleet.hosts:
            fleet.start_sshd(name)
    except Exception:
        fleet.close()
        raise
    return fleet


def control_dir(public: Path) -> Path:
    """The fleet's SSH connection-sharing sockets: under its short key folder, since a socket's
    path must fit in 108 bytes (a pytest temp folder, more so a parallel worker's, may not)."""
    return public / "ssh-control"


def ssh_fleet_layout(tmp: Path, names: list[str], keys: Path, public: Path, nodes_root: Path,
                     time_factor: float = 0.005, tp: int | None = None,
                     first_address: int = 11) -> SshFleet:
    """Keys, one sshd config per node on its own loopback address, and an inventory that
    reaches each node as the login user with sudo. Starts nothing."""
    ensure_login_user()
    inventory = tmp / "inventory"
    shutil.copytree(REPO / "inventory" / "local", inventory)
    keys.mkdir(parents=True)
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                        str(keys / name)], check=True)
    public.chmod(0o755)
    authorized = public / "authorized_keys"
    authorized.write_text((keys / "client_key.pub").read_text())
    authorized.chmod(0o644)
    ssh_ports = free_port_block(len(names))
    base = free_port_block(len(names))
    nodes, members = {}, {}
    for i, name in enumerate(names):
        address, port = f"127.0.0.{first_address + i}", ssh_ports + i
        config = keys / f"{name}.sshd_config"
        config.write_text("\n".join([
            f"ListenAddress {address}:{port}", f"HostKey {keys / 'host_key'}",
            f"AuthorizedKeysFile {authorized}", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
            f"AllowUsers {LOGIN_USER}", f"PidFile {keys / name}.pid", "LogLevel ERROR",
            "MaxStartups 100:30:200", ""]))
        nodes[name] = SshNode(name, address, port, config, keys / f"{name}.sshd.log")
        members[name] = {"sglang_sim_node_index": i, "ansible_host": address,
                         "ansible_port": port}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(
        {"all": {"children": {"sglang_servers": {"hosts": members}}}}))
    group_vars = inventory / "group_vars" / "sglang_servers.yml"
    settings = yaml.safe_load(group_vars.read_text())
    settings.update(
        ansible_connection="ssh", ansible_user=LOGIN_USER,
        ansible_ssh_private_key_file=str(keys / "client_key"),
        ansible_ssh_common_args="-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                                "-o ConnectTimeout=5",
        ansible_become=True,
        # Connection-sharing sockets in the fleet's own folder, so close() can end them.
        ansible_control_path_dir=str(control_dir(public)),
        # The node's Python: this checkout's environment, reached as root through sudo.
        ansible_python_interpreter=sys.executable,
        sglang_server_python=sys.executable,
        sglang_server_sim_time_factor=time_factor, sglang_server_gate_poll_interval=10)
    settings.update(tp_settings(tp))
    group_vars.write_text(yaml.safe_dump(settings, sort_keys=False))
    extra = {"sglang_fleet_sim_root": str(nodes_root), "sglang_fleet_sim_base_port": base,
             **own_stores(tmp)}
    return SshFleet(inventory, nodes_root, base, names, extra, nodes, public)
