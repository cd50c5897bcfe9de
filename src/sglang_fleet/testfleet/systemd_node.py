"""A test node that runs a real systemd, isolated from the machine it runs on.

systemd boots as PID 1 of new PID, mount and cgroup namespaces (`unshare`), with sshd as one of
its units on its own loopback address and port; Ansible reaches it over SSH with become, like
the SSH fleet, so tasks run inside the namespaces and `systemctl` talks to the real manager.

A private mount namespace still shares the filesystem, and systemd's boot units act on it (its
tmpfiles setup once emptied a shared /tmp within seconds). So before systemd starts, inside the
namespaces, the node:

- mounts private tmpfs on /tmp, /run, /var/tmp, /var/lib/systemd and /var/log/journal;
- gives itself a minimal private /dev (null, zero, full, random, urandom, tty, its own devpts
  and /dev/shm; /dev/console is /dev/null), so nothing it creates there (/dev/log, ...)
  reaches the machine's devtmpfs;
- makes /proc/sys read-only, so no sysctl can change the machine;
- where the toolkit (this checkout and the Python environment whose interpreter the node's
  modules and servers run) lies under /tmp, shows it read-only at the same path inside the
  private /tmp, so a checkout in /tmp works and nothing in the node can change it;
- mounts its cgroup hierarchies inside its own cgroup namespace, rooted at a cgroup made for it;
- bind-mounts its own folder over /etc/systemd/system, so unit files and enable links stay in
  the node's folder;
- masks, as runtime masks in its private /run, every unit that could act on the host (tmpfiles,
  udev, sysctl, modules-load, timesyncd, random-seed, getty, networkd, resolved, remount-fs,
  and the rest of MASKED_UNITS);
- tells systemd it is in a container (`container=`) and boots a minimal target of its own.

It checks each of these from inside before it execs systemd, and refuses to boot, saying why,
when one does not hold. Its folders live outside /tmp (the private /tmp is not the machine's).
It is stopped by the PID it started (poweroff signal, then SIGKILL of that PID 1, which ends
every process of its PID namespace), never by name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sglang_fleet.testfleet.local import REPO
from sglang_fleet.testfleet.ssh import SshFleet, ssh_fleet_layout

SYSTEMD = Path("/lib/systemd/systemd")
SSHD = Path("/usr/sbin/sshd")
NODES_ROOT = Path("/var/lib/sglang-fleet-tests")  # outside /tmp: the node's /tmp is private
CGROUP_ROOT = Path("/sys/fs/cgroup")
TARGET = "sglang-fleet-test.target"
SSHD_UNIT = "sglang-fleet-test-sshd.service"
REFUSED = 97  # the exit status of a boot refused for want of isolation
# What the node's modules and servers run: the interpreter Ansible is given is this environment's.
TOOLKIT = (REPO, Path(sys.prefix).resolve())

# Units that could act on the machine, or that a test node has no use for. Template names mask
# every instance.
MASKED_UNITS = (
    # tmpfiles: would clean and create files in the shared filesystem
    "systemd-tmpfiles-setup.service", "systemd-tmpfiles-setup-dev.service",
    "systemd-tmpfiles-setup-dev-early.service", "systemd-tmpfiles-clean.service",
    "systemd-tmpfiles-clean.timer",
    # udev: would trigger and settle the machine's devices
    "systemd-udevd.service", "systemd-udevd-control.socket", "systemd-udevd-kernel.socket",
    "systemd-udev-trigger.service", "systemd-udev-settle.service", "systemd-hwdb-update.service",
    # sysctl, kernel modules, binfmt
    "systemd-sysctl.service", "systemd-modules-load.service", "kmod-static-nodes.service",
    "systemd-binfmt.service", "proc-sys-fs-binfmt_misc.automount",
    "proc-sys-fs-binfmt_misc.mount",
    # clock and random seed
    "systemd-timesyncd.service", "systemd-time-wait-sync.service", "systemd-random-seed.service",
    # consoles and logins
    "getty.target", "getty@.service", "serial-getty@.service", "console-getty.service",
    "container-getty@.service", "console-setup.service", "keyboard-setup.service",
    "systemd-vconsole-setup.service", "systemd-ask-password-console.path",
    "systemd-ask-password-wall.path", "systemd-logind.service", "systemd-user-sessions.service",
    # network
    "systemd-networkd.service", "systemd-networkd.socket",
    "systemd-networkd-wait-online.service", "systemd-resolved.service",
    # file systems
    "systemd-remount-fs.service", "tmp.mount", "dev-hugepages.mount", "dev-mqueue.mount",
    "sys-kernel-config.mount", "sys-kernel-debug.mount", "sys-kernel-tracing.mount",
    "sys-fs-fuse-connections.mount", "systemd-fsck-root.service", "systemd-fsck@.service",
    "systemd-quotacheck.service", "quotaon.service", "systemd-pstore.service",
    "systemd-repart.service", "e2scrub_reap.service", "e2scrub_all.timer", "fstrim.timer",
    # machine identity, users, records in /var and /etc
    "systemd-sysusers.service", "systemd-firstboot.service",
    "systemd-machine-id-commit.service", "systemd-update-utmp.service",
    "systemd-update-utmp-runlevel.service", "systemd-journal-flush.service",
    "systemd-journal-catalog-update.service", "systemd-update-done.service", "ldconfig.service",
    "systemd-pcrphase.service", "systemd-pcrphase-sysinit.service",
    "systemd-boot-system-token.service", "systemd-boot-update.service",
    "systemd-backlight@.service", "systemd-rfkill.service", "systemd-rfkill.socket",
    "systemd-journald-audit.socket",
    # the machine's own services and timers
    "ssh.service", "ssh.socket", "cron.service", "postgresql.service", "apt-daily.timer",
    "apt-daily-upgrade.timer", "dpkg-db-backup.timer", "man-db.timer", "logrotate.timer",
)
_V1_OPTIONS = {"systemd": "none,name=systemd"}  # other v1 hierarchies mount by their name


class IsolationError(RuntimeError):
    """The node could not set up its isolation, so it did not boot systemd."""


def unavailable() -> str | None:
    """Why a systemd test node cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "needs root (namespaces, mounts, cgroups)"
    for tool in (SYSTEMD, SSHD, Path("/usr/bin/unshare"), Path("/usr/bin/nsenter")):
        if not tool.exists():
            return f"needs {tool}"
    if not shutil.which("sudo"):
        return "needs sudo (./bootstrap --test-fleet installs it)"
    if not (CGROUP_ROOT / "unified").is_dir() and not (CGROUP_ROOT / "cgroup.procs").exists():
        return "needs a cgroup v2 (or hybrid v1/v2) hierarchy under /sys/fs/cgroup"
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount", "--cgroup",
                            "--propagation", "private", "true"], capture_output=True, text=True)
    if probe.returncode:
        return f"cannot create PID, mount and cgroup namespaces: {probe.stderr.strip()}"
    return None


def _hierarchies() -> list[tuple[Path, str, str]]:
    """(mount point, fstype, mount options) of each cgroup hierarchy of this machine."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, fstype, options = line.split()[:4]
        if fstype in ("cgroup", "cgroup2") and point.startswith(str(CGROUP_ROOT)):
            found.append((Path(point), fstype, options))
    return found


def _own_cgroup(point: Path, fstype: str, options: str) -> str:
    """This process's cgroup path in the hierarchy mounted at `point`."""
    wanted = None if fstype == "cgroup2" else {o for o in options.split(",")
                                                if o not in ("rw", "ro", "relatime",
                                                             "nosuid", "nodev", "noexec")}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, controllers, path = line.split(":", 2)
        if fstype == "cgroup2" and hid == "0":
            return path
        if wanted is not None and controllers and set(controllers.split(",")) <= wanted | {
                f"name={o.split('=', 1)[1]}" for o in wanted if o.startswith("name=")}:
            return path
    return "/"


@dataclass
class SystemdNode:
    """One booted node. Create with boot_node(); stop with shutdown()."""

    name: str
    address: str
    ssh_port: int
    folder: Path
    launcher: subprocess.Popen | None = None
    init_pid: int | None = None
    cgroups: list[Path] = field(default_factory=list)

    @property
    def log(self) -> Path:
        return self.folder / "systemd.log"

    @property
    def unit_dir(self) -> Path:
        """What the node sees as /etc/systemd/system."""
        return self.folder / "etc-systemd-system"

    # -- inside the node ------------------------------------------------------------------
    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run a command inside the node's namespaces (as root), e.g. systemctl."""
        if not self.init_pid:
            raise RuntimeError(f"systemd node {self.name} is not running")
        return subprocess.run(["nsenter", "-t", str(self.init_pid), "-m", "-p", "-C", "--",
                               *argv], capture_output=True, text=True, timeout=timeout)

    def systemctl(self, *args: str) -> str:
        return self.run("systemctl", *args).stdout.strip()

    def unit_property(self, unit: str, prop: str) -> str:
        return self.systemctl("show", "-p", prop, "--value", unit)

    def journal(self) -> str:
        """The node's journal since boot (volatile, inside the node)."""
        return self.run("journalctl", "-b", "--no-pager", "-o", "short-precise").stdout

    # -- life cycle -----------------------------------------------------------------------
    def _signal_init(self, sig: int) -> None:
        """Signal the namespace's PID 1, only while it is still the launcher's child: a PID
        number alone could have been reused by someone else's process."""
        if not self.init_pid or self.launcher is None:
            return
        try:
            stat = Path(f"/proc/{self.init_pid}/stat").read_text()
        except OSError:
            return
        if int(stat.rpartition(")")[2].split()[1]) == self.launcher.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, sig)

    def shutdown(self, timeout: float = 60) -> None:
        """Power the node off by the PID this harness started; SIGKILL that PID 1 (which ends
        its whole PID namespace) if it does not finish in time. Removes its cgroups."""
        if self.launcher is not None and self.launcher.poll() is None:
            if self.init_pid:
                # Keep the node's journal beside its log: the volatile one ends with the node.
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    (self.folder / "journal.txt").write_text(self.journal())
                self._signal_init(signal.SIGRTMIN + 4)  # systemd: poweroff
            try:
                self.launcher.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal_init(signal.SIGKILL)
                self.launcher.wait(30)
        self.init_pid = None
        for cgroup in sorted(self.cgroups, key=lambda p: len(p.parts), reverse=True):
            _remove_cgroup_tree(cgroup)
        self.cgroups = []


def _remove_cgroup_tree(path: Path, timeout: float = 30) -> None:
    """Remove a node's cgroup subtree, deepest first. The kernel kills a PID namespace's other
    processes when its PID 1 ends, but they leave their cgroups a moment later: retry until the
    tree is gone (a cgroup with members refuses rmdir with EBUSY)."""
    deadline = time.monotonic() + timeout
    while path.is_dir():
        for child in sorted((p for p in path.rglob("*") if p.is_dir()),
                            key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                child.rmdir()
        with contextlib.suppress(OSError):
            path.rmdir()
        if not path.is_dir() or time.monotonic() > deadline:
            return
        time.sleep(0.1)


def _listening(address: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((address, port)) == 0


def _toolkit_under_tmp(paths: tuple[Path, ...] = TOOLKIT) -> list[Path]:
    """The toolkit's folders under /tmp, none inside another: what the private /tmp must show."""
    under = sorted({p for p in paths if p.is_relative_to("/tmp") and p != Path("/tmp")})
    return [p for p in under if not any(p != q and p.is_relative_to(q) for q in under)]


def _setup_script(node: SystemdNode, sshd_config: Path, canary: Path,
                  hierarchies: list[tuple[Path, str, str]]) -> str:
    """What runs as PID 1 of the new namespaces before it becomes systemd."""
    masks = " ".join(MASKED_UNITS)
    # Bound to a stage in the node's own folder before the private /tmp hides them, moved into
    # it after, read-only there.
    toolkit = [(path, node.folder / f"toolkit-{i}") for i, path in enumerate(_toolkit_under_tmp())]
    keep_toolkit = "".join(
        f'mkdir -p "{stage}" && mount --bind "{path}" "{stage}" '
        f'|| refuse "cannot keep the toolkit at {path}"\n' for path, stage in toolkit)
    show_toolkit = "".join(
        f'mkdir -p "{path}" && mount --move "{stage}" "{path}" '
        f'&& mount -o remount,bind,ro "{path}" || refuse "cannot show the toolkit at {path}"\n'
        for path, stage in toolkit)
    cgroup_mounts = []
    for point, fstype, options in hierarchies:
        rel = point.relative_to(CGROUP_ROOT)
        if fstype == "cgroup2":
            cgroup_mounts.append(f"mkdir -p /sys/fs/cgroup/{rel} && "
                                 f"mount -t cgroup2 cgroup2 /sys/fs/cgroup/{rel}")
        else:
            opts = _V1_OPTIONS.get(str(rel)) or ",".join(
                o for o in options.split(",") if o not in ("rw", "relatime"))
            cgroup_mounts.append(f"mkdir -p /sys/fs/cgroup/{rel} && "
                                 f"mount -t cgroup -o {opts} cgroup /sys/fs/cgroup/{rel}")
    sshd_unit = "\n".join([
        "[Unit]", "Description=sshd of the sglang-fleet systemd test node",
        "DefaultDependencies=no", "", "[Service]", "Type=simple", "RuntimeDirectory=sshd",
        f"ExecStart={SSHD} -D -e -f {sshd_config}", "KillMode=process", ""])
    target = "\n".join([
        "[Unit]", "Description=sglang-fleet systemd test node", "DefaultDependencies=no",
        f"Requires={SSHD_UNIT}", f"After={SSHD_UNIT}",
        # Its journal (volatile, in the private /run): what the node's journal() returns.
        "Wants=systemd-journald.service", "AllowIsolate=yes", ""])
    return f"""set -eu
refuse() {{ echo "systemd test node {node.name}: refusing to boot: $*" >&2; exit {REFUSED}; }}
{keep_toolkit}# Private scratch and state folders first: nothing below may touch the machine's.
for d in /tmp /var/tmp /run; do mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$d" \\
  || refuse "cannot mount a private tmpfs on $d"; done
chmod 755 /run
mount -t tmpfs -o mode=755 tmpfs /var/lib/systemd || refuse "no private /var/lib/systemd"
if [ -d /var/log/journal ]; then mount -t tmpfs tmpfs /var/log/journal \\
  || refuse "no private /var/log/journal"; fi
[ ! -e {canary} ] || refuse "/tmp is still the machine's (its canary is visible)"
{show_toolkit}# A minimal private /dev.
mkdir /tmp/dev && mount -t tmpfs -o mode=755,nosuid tmpfs /tmp/dev || refuse "no tmpfs /dev"
for dev in null zero full random urandom tty; do
  touch /tmp/dev/$dev && mount --bind /dev/$dev /tmp/dev/$dev || refuse "cannot bind /dev/$dev"
done
mkdir /tmp/dev/pts /tmp/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts /tmp/dev/pts \\
  || refuse "no private devpts"
ln -s pts/ptmx /tmp/dev/ptmx
mount -t tmpfs -o mode=1777 tmpfs /tmp/dev/shm
ln -s /proc/self/fd /tmp/dev/fd
# No console of the machine: systemd's own messages go to its journal (journal()).
touch /tmp/dev/console && mount --bind /dev/null /tmp/dev/console || refuse "no console"
mount --move /tmp/dev /dev || refuse "cannot move the private /dev into place"
# No sysctl can reach the machine.
mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys \\
  || refuse "cannot make /proc/sys read-only"
# cgroup hierarchies rooted at this node's own cgroup (the cgroup namespace's root).
mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup || refuse "no private /sys/fs/cgroup"
{chr(10).join(c + ' || refuse "cannot mount a cgroup hierarchy"' for c in cgroup_mounts)}
grep -q '^0::/$' /proc/self/cgroup || refuse "not at the root of its own cgroup namespace"
# Units: this node's own /etc/systemd/system, runtime masks and its minimal target.
mount --bind {node.unit_dir} /etc/systemd/system || refuse "cannot bind its unit folder"
mkdir -p /run/systemd/system /run/systemd/journald.conf.d
for unit in {masks}; do ln -s /dev/null /run/systemd/system/$unit; done
printf '[Journal]\\nStorage=volatile\\nReadKMsg=no\\n' \\
  > /run/systemd/journald.conf.d/sglang-fleet-test.conf
cat > /run/systemd/system/{SSHD_UNIT} <<'UNIT'
{sshd_unit}UNIT
cat > /run/systemd/system/{TARGET} <<'UNIT'
{target}UNIT
# Checked, all of it: hand over to systemd.
[ "$(stat -f -c %T /tmp)" = tmpfs ] && [ "$(stat -f -c %T /run)" = tmpfs ] \\
  && [ "$(stat -f -c %T /dev)" = tmpfs ] || refuse "private mounts are not in place"
awk '$2 == "/proc/sys" && $4 ~ /^ro(,|$)/' /proc/self/mounts | grep -q . \\
  || refuse "/proc/sys is not read-only"
exec env -i container=sglang-fleet-test PATH=/usr/sbin:/usr/bin:/sbin:/bin \\
  {SYSTEMD} --system --unit={TARGET} --show-status=false
"""


def boot_node(name: str, address: str, ssh_port: int, sshd_config: Path, folder: Path,
              timeout: float = 90) -> SystemdNode:
    """Boot one node whose sshd (a unit of its systemd) listens on address:ssh_port.

    `folder` must be outside /tmp; the sshd config and every file it names too."""
    why = unavailable()
    if why:
        raise IsolationError(f"systemd test node {name}: {why}")
    for path in (folder, sshd_config):
        if Path(path).resolve().is_relative_to("/tmp"):
            raise IsolationError(f"systemd test node {name}: {path} is under /tmp, which the "
                                 "node replaces with a private tmpfs; keep node files outside")
    node = SystemdNode(name, address, ssh_port, folder)
    node.unit_dir.mkdir(parents=True, exist_ok=True)
    # A canary in the machine's /tmp: the node must not see it (its /tmp is private) and must
    # leave it alone.
    canary = Path(tempfile.mkstemp(prefix=f"sglang-fleet-{name}-canary-", dir="/tmp")[1])
    hierarchies = _hierarchies()
    try:
        # A cgroup of the node's own in every hierarchy; the launcher enters them before it
        # unshares its cgroup namespace, so systemd's "/" is this subtree.
        moves = []
        for point, fstype, options in hierarchies:
            own = point / _own_cgroup(point, fstype, options).lstrip("/") / (
                f"sglang-fleet-test-{name}-{os.getpid()}")
            own.mkdir(parents=True, exist_ok=True)
            node.cgroups.append(own)
            for knob in ("cpuset.cpus", "cpuset.mems"):  # v1 cpuset: empty refuses members
                if (own / knob).exists() and not (own / knob).read_text().strip():
                    (own / knob).write_text((own.parent / knob).read_text())
            moves.append(f'echo $$ > "{own}/cgroup.procs"')
        script = _setup_script(node, sshd_config, canary, hierarchies)
        launch = " && ".join(moves + [
            "exec unshare --pid --fork --mount-proc --mount --cgroup --propagation private "
            f'-- /bin/bash -c "$1" {name}-init'])
        with open(node.log, "ab") as log:
            node.launcher = subprocess.Popen(["/bin/bash", "-c", launch, f"{name}-launcher",
                                              script],
                                             stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True)
        node.init_pid = _wait_for_init(node, timeout)
        deadline = time.monotonic() + timeout
        while not _listening(address, ssh_port):
            if node.launcher.poll() is not None:
                raise _boot_failure(node)
            if time.monotonic() > deadline:
                raise IsolationError(f"systemd test node {name}: sshd did not come up in "
                                     f"{timeout:.0f} s; see {node.log}")
            time.sleep(0.2)
        return node
    except BaseException:
        node.shutdown(timeout=20)
        raise
    finally:
        canary.unlink(missing_ok=True)


def _wait_for_init(node: SystemdNode, timeout: float) -> int:
    """The machine's PID of the namespace's PID 1 (unshare's child)."""
    assert node.launcher is not None
    deadline = time.monotonic() + timeout
    children_file = Path(f"/proc/{node.launcher.pid}/task/{node.launcher.pid}/children")
    while time.monotonic() < deadline:
        if node.launcher.poll() is not None:
            raise _boot_failure(node)
        try:
            children = children_file.read_text().split()
        except OSError:
            children = []
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise IsolationError(f"systemd test node {node.name}: no PID 1 after {timeout:.0f} s")


def _boot_failure(node: SystemdNode) -> IsolationError:
    assert node.launcher is not None
    text = node.log.read_text(errors="replace") if node.log.exists() else ""
    reason = next((line for line in text.splitlines() if "refusing to boot" in line), None)
    if node.launcher.returncode == REFUSED and reason:
        return IsolationError(reason)
    return IsolationError(f"systemd test node {node.name} exited with status "
                          f"{node.launcher.returncode} while booting; last lines: "
                          f"{text.strip().splitlines()[-5:]}")


def node_folder(name: str) -> Path:
    """A fresh folder for one node, outside /tmp."""
    NODES_ROOT.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=NODES_ROOT))


@dataclass
class SystemdFleet(SshFleet):
    """Simulated nodes that each run a real, isolated systemd; servers run as its units."""

    machines: dict[str, SystemdNode] = field(default_factory=dict)
    folder: Path | None = None

    def machine(self, host: str) -> SystemdNode:
        return self.machines[host]

    def unit(self, host: str) -> str:
        return f"sglang-Kimi-K2.5-{self.port(host)}.service"

    def close(self) -> None:
        self.close_connections()
        for machine in self.machines.values():
            machine.shutdown()
        self.machines = {}
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


def make_systemd_fleet(tmp: Path, hosts: int = 1, time_factor: float = 0.005,
                       tp: int = 1) -> SystemdFleet:
    """Nodes reached over SSH whose servers run under a real systemd each (service manager
    systemd). Node folders (roots, keys, unit files) live outside /tmp; the inventory and the
    controller's stores stay in `tmp`."""
    folder = node_folder("systemd-fleet")
    machines: dict[str, SystemdNode] = {}
    try:
        layout = ssh_fleet_layout(tmp, [f"systemd-node-{i}" for i in range(1, hosts + 1)],
                                  keys=folder / "ssh", public=folder,
                                  nodes_root=folder / "nodes", time_factor=time_factor, tp=tp,
                                  first_address=31)
        group_vars = layout.inventory / "group_vars" / "sglang_servers.yml"
        settings = yaml.safe_load(group_vars.read_text())
        settings["sglang_server_service_manager"] = "systemd"
        group_vars.write_text(yaml.safe_dump(settings, sort_keys=False))
        for name, ssh in layout.nodes.items():
            (folder / name).mkdir()
            machines[name] = boot_node(name, ssh.address, ssh.port, ssh.config, folder / name)
    except BaseException:
        for machine in machines.values():
            machine.shutdown()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return SystemdFleet(**{f.name: getattr(layout, f.name) for f in dataclasses.fields(layout)},
                        machines=machines, folder=folder)
