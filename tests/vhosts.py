"""Hosts of their own on this machine, for the site tests: a network and a UTS namespace each.

A compute node has its own hostname and address, and what a job on one node
does cannot be seen from another except over the network. Daemons run on one
kernel share both (two PBS MOMs on one host made every job believe it ran on
the first; ranks that "cross hosts" over loopback test nothing). So each
virtual host here is

* a network namespace (``ip netns``) with one veth link onto a bridge, its own
  address on a private /24 and a loopback of its own;
* a UTS namespace per command (``unshare --uts``), whose hostname is the host's;
* an ``/etc/hosts`` that names every host of the set, bind-mounted over the
  real one in a mount namespace of each command (``/etc/netns/NS/hosts``, with an
  ``nsswitch.conf`` that resolves hosts from it alone), so names resolve the
  same way on every host, as a site's DNS does, and the machine's own
  ``/etc/hosts`` is never touched. There is no route out: only the hosts of
  the set and this machine's bridge address are reachable.

Commands run on a host as root or as a user (``setpriv``: after the hostname is
set, before the command). ``stop()`` kills everything left in the namespaces
and removes them, the bridge and the hosts files. Needs root, ``ip``,
``unshare`` and ``setpriv`` (iproute2, util-linux).
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

NETNS_ETC = Path("/etc/netns")
TOOLS = ("ip", "nsenter", "unshare", "setpriv")
NSSWITCH = "passwd: files\ngroup: files\nshadow: files\nhosts: files\nnetworks: files\nprotocols: files\nservices: files\n"


def missing() -> str | None:
    """Why virtual hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "virtual hosts need root (network and UTS namespaces)"
    absent = [t for t in TOOLS if shutil.which(t) is None]
    if absent:
        return f"virtual hosts need {', '.join(absent)} (iproute2, util-linux)"
    return None


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30, check=check)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 that no interface of this machine uses."""
    used = _ip("-o", "-4", "addr", "show").stdout
    for third in range(0, 256):
        for second in range(200, 208):
            net = ipaddress.IPv4Network(f"10.{second}.{third}.0/24")
            if f" 10.{second}.{third}." not in used:
                return net
    raise RuntimeError("no free 10.200.0.0/13 subnet for the virtual hosts")


class VirtualHosts:
    """``VirtualHosts(["pfsrv", "pfn1", "pfn2"])``: start(), then ``run(host, argv)`` / ``popen(host, argv)``; stop()."""

    def __init__(self, names: Sequence[str], tag: str | None = None, gateway_names: Sequence[str] = ()):
        """``gateway_names``: names that resolve, on every host, to this machine's address on the bridge (a test's own
        process, outside every host, can listen there)."""
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"host names must be distinct and at least one: {names}")
        self.names = list(names)
        self.tag = tag or secrets.token_hex(2)
        self.bridge = f"pfbr{self.tag}"
        self.subnet = _free_subnet()
        hosts = list(self.subnet.hosts())
        self.gateway = str(hosts[0])  # the bridge's own address (this machine, outside every host)
        self.addresses = {n: str(hosts[i + 1]) for i, n in enumerate(self.names)}
        self.gateway_names = [n for n in gateway_names if n not in self.addresses]
        self.started = False

    def netns(self, host: str) -> str:
        return f"pf{self.tag}-{host}"

    # ------------------------------------------------------------ life cycle

    def start(self) -> None:
        self.started = True
        remove_stale()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        table = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in self.addresses.items())
        table += "".join(f"{self.gateway} {n}\n" for n in self.gateway_names)
        for i, host in enumerate(self.names):
            ns, veth = self.netns(host), f"pfv{self.tag}{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.addresses[host]}/{self.subnet.prefixlen}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            etc = NETNS_ETC / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(table)
            OWNERS.mkdir(parents=True, exist_ok=True)
            (OWNERS / ns).write_text(f"{os.getpid()} {self.bridge}\n")  # a later run removes what a killed one left
            # Names resolve from the hosts file alone: a DNS server the namespace cannot reach would make every lookup
            # of a name not listed wait out resolver timeouts (PBS's daemons took 20 s per step that way).
            (etc / "nsswitch.conf").write_text(NSSWITCH)
            (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

    def stop(self) -> None:
        """Kill every process left in the hosts' namespaces, then remove the namespaces, links and hosts files."""
        if not self.started:
            return
        for host in self.names:
            ns = self.netns(host)
            for sig in (signal.SIGTERM, signal.SIGKILL):
                pids = _ip("netns", "pids", ns, check=False).stdout.split()
                for pid in pids:
                    try:
                        os.kill(int(pid), sig)
                    except (ProcessLookupError, ValueError):
                        pass
                if pids and sig == signal.SIGTERM:
                    time.sleep(1.0)
            _ip("netns", "del", ns, check=False)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
            (OWNERS / ns).unlink(missing_ok=True)
        _ip("link", "del", self.bridge, check=False)
        self.started = False

    def processes(self, host: str) -> list[int]:
        """Pids of every process in ``host``'s network namespace."""
        return [int(p) for p in _ip("netns", "pids", self.netns(host), check=False).stdout.split()]

    # ------------------------------------------------------------ commands on a host

    def argv(self, host: str, argv: Sequence[str], user: str | None = None, env: Mapping[str, str] | None = None) -> list[str]:
        """``argv`` as run on ``host``: in its namespaces, with its hostname, as ``user`` (default root), with exactly
        ``env`` (default: this process's environment) plus HOME/USER/LOGNAME of the user."""
        if host not in self.addresses:
            raise KeyError(f"no virtual host {host!r} (hosts: {', '.join(self.names)})")
        env = dict(os.environ if env is None else env)
        drop: list[str] = []
        if user is not None:
            pw = pwd.getpwnam(user)
            env.update(HOME=pw.pw_dir, USER=user, LOGNAME=user)
            drop = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--"]
        environ = ["env", "-i", *(f"{k}={v}" for k, v in env.items())]
        ns = self.netns(host)
        # Not `ip netns exec`: it mounts a sysfs of the namespace over /sys, which hides the cgroup hierarchy (slurmd
        # needs it). A mount namespace of our own instead, with the hosts' name files bound over /etc's.
        setup = 'ns=$0; host=$1; shift; for f in hosts nsswitch.conf resolv.conf; do mount --bind "/etc/netns/$ns/$f" "/etc/$f" || exit 125; done; hostname "$host" || exit 125; exec "$@"'
        return ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--mount", "--uts", "--propagation", "private", "--", "sh", "-c", setup, ns, host,
                *drop, *environ, *argv]  # fmt: skip

    def run(self, host: str, argv: Sequence[str], user: str | None = None, env: Mapping[str, str] | None = None, check: bool = True,
            timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:  # fmt: skip
        proc = subprocess.run(self.argv(host, argv, user, env), capture_output=True, text=True, timeout=timeout, **kwargs)
        if check and proc.returncode != 0:
            raise AssertionError(f"on {host} as {user or 'root'}: {list(argv)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
        return proc

    def popen(self, host: str, argv: Sequence[str], user: str | None = None, env: Mapping[str, str] | None = None, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.argv(host, argv, user, env), **kwargs)


OWNERS = Path("/run/pilotfill-vhosts")  # namespace -> "pid bridge" of the test process that made it


def remove_stale() -> None:
    """Remove the namespaces, bridges and hosts files of virtual hosts whose test process is gone (killed before its
    ``stop()``): their daemons would hold ports and memory, their links clutter ``ip link``."""
    if not OWNERS.is_dir():
        return
    for owner in OWNERS.iterdir():
        try:
            pid, bridge = owner.read_text().split()
        except (OSError, ValueError):
            continue
        if os.path.exists(f"/proc/{pid}"):
            continue
        for p in _ip("netns", "pids", owner.name, check=False).stdout.split():
            try:
                os.kill(int(p), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _ip("netns", "del", owner.name, check=False)
        _ip("link", "del", bridge, check=False)
        shutil.rmtree(NETNS_ETC / owner.name, ignore_errors=True)
        owner.unlink(missing_ok=True)


def ensure_user(name: str, home: Path) -> pwd.struct_passwd:
    """A local user ``name`` whose home is ``home`` (made, or moved there if it exists), owning ``home``."""
    home.mkdir(parents=True, exist_ok=True)
    try:
        pwd.getpwnam(name)
        subprocess.run(["usermod", "-d", str(home), name], check=True, capture_output=True, timeout=30)
    except KeyError:
        subprocess.run(["useradd", "-M", "-d", str(home), "-s", "/bin/sh", "-U", name], check=True, capture_output=True, timeout=30)
    pw = pwd.getpwnam(name)
    os.chown(home, pw.pw_uid, pw.pw_gid)
    home.chmod(0o755)
    return pw


class Traversal:
    """Lets some users reach paths under directories closed to them (``/root`` is 0700 and holds pyenv's Python and
    the OpenPBS build): a search-only ACL entry (``u:USER:--x``) on each closed ancestor, taken back by ``undo``."""

    def __init__(self) -> None:
        self.granted: list[tuple[Path, str]] = []

    def grant(self, users: Sequence[str], paths: Sequence[Path]) -> None:
        if shutil.which("setfacl") is None:
            raise RuntimeError("setfacl is needed to let the test users reach this checkout's Python (apt-get install acl)")
        for path in paths:
            for d in [*reversed(Path(path).resolve().parents), Path(path).resolve()]:
                if not d.is_dir() or d.stat().st_mode & 0o001:
                    continue
                for user in users:
                    subprocess.run(["setfacl", "-m", f"u:{user}:x", str(d)], check=True, capture_output=True, timeout=30)
                    self.granted.append((d, user))

    def undo(self) -> None:
        for d, user in reversed(self.granted):
            subprocess.run(["setfacl", "-x", f"u:{user}", str(d)], capture_output=True, timeout=30)
        self.granted.clear()
