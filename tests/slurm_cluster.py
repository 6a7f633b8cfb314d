"""A real Slurm on this machine for tests: slurmctld and several ``slurmd -N nodeX`` from Debian's packages.

No munge (``AuthType=auth/none``), no cgroups (``proctrack/linuxproc``,
``task/none``), every daemon on its own port, state in a temporary directory.
Two partitions over the same nodes: ``main`` (high priority) and ``scavenger``
(low priority, preempted by ``main`` with a grace period, as a site would
configure a pilot queue). ``stop()`` cancels every job and kills every daemon
it started, so nothing is left running.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

CONF = """ClusterName=pftest
SlurmctldHost={ctld}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
SlurmctldPort={ctld_port}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1{scheduler_parameters}
SelectType=select/linear
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
MpiDefault=none
ReturnToService=2
SwitchType=switch/none
SlurmdTimeout=30
InactiveLimit=0
MinJobAge={min_job_age}
KillWait={grace}
{extra}
{nodes}
PartitionName=main Nodes={nodelist} PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP Default=YES
PartitionName=scavenger Nodes={nodelist} PriorityTier=1 PreemptMode=CANCEL GraceTime={grace} MaxTime=INFINITE State=UP
"""


def available() -> bool:
    return all(shutil.which(c) for c in ("slurmctld", "slurmd", "sbatch", "sinfo", "scontrol", "squeue", "scancel"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONTROL_HOST = "pfctl"


class SlurmCluster:
    """``min_job_age``: how long slurmctld keeps a finished job before purging it (then squeue no longer knows
    it); ``scheduler_parameters``: added to SchedulerParameters; ``extra``: more slurm.conf lines.

    ``hosts=True``: every daemon on a host of its own (:mod:`vhosts`: a network and UTS namespace each) — slurmctld
    on :data:`CONTROL_HOST` (the login node: run commands and campaigns there, :meth:`command`, :meth:`popen`), each
    slurmd on ``node1``… with that hostname and its own address, so a job's ranks really cross hosts. Without it
    (the default) every slurmd runs on this host, on ports of its own."""

    def __init__(self, root: Path, nodes: int = 4, grace_s: int = 5, min_job_age: int = 60, scheduler_parameters: str = "", extra: str = "",
                 features: dict[str, str] | None = None, hosts: bool = False):  # fmt: skip
        """``features``: node name -> its features (``Feature=`` in slurm.conf), for machines with several kinds of node."""
        self.root = Path(root)
        self.names = [f"node{i + 1}" for i in range(nodes)]
        for d in ("state", "spool", "log", *(f"spool/{n}" for n in self.names)):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        features = features or {}
        self.hosts = None
        if hosts:
            from vhosts import VirtualHosts

            self.hosts = VirtualHosts([CONTROL_HOST, *self.names], gateway_names=(socket.gethostname(),))
            ctld = f"{CONTROL_HOST}({self.hosts.addresses[CONTROL_HOST]})"
            where = {n: f"NodeHostname={n} NodeAddr={self.hosts.addresses[n]}" for n in self.names}
            ctld_port = 6817
        else:
            host = socket.gethostname()
            ctld = f"{host}(127.0.0.1)"
            where = {n: f"NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()}" for n in self.names}
            ctld_port = free_port()
        node_lines = "\n".join(f"NodeName={n} {where[n]} CPUs=1 State=UNKNOWN" + (f" Feature={features[n]}" if n in features else "") for n in self.names)
        self.conf = self.root / "slurm.conf"
        self.conf.write_text(
            CONF.format(ctld=ctld, ctld_port=ctld_port, root=self.root, grace=grace_s, nodes=node_lines, nodelist=",".join(self.names),
                        min_job_age=min_job_age, scheduler_parameters="," + scheduler_parameters if scheduler_parameters else "", extra=extra)
        )
        self.env = {"SLURM_CONF": str(self.conf)}
        self.started = False

    def command(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        if self.hosts is not None:
            return self.hosts.run(CONTROL_HOST, list(argv), env={**os.environ, **self.env}, check=check, timeout=timeout)
        return subprocess.run(list(argv), env={**os.environ, **self.env}, capture_output=True, text=True, timeout=timeout, check=check)

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        """``argv`` on the login node (the control host with ``hosts=True``, else here), with this cluster's SLURM_CONF."""
        env = {**os.environ, **self.env, **kwargs.pop("env", {})}
        if self.hosts is not None:
            return self.hosts.popen(CONTROL_HOST, argv, env=env, **kwargs)
        return subprocess.Popen(argv, env=env, **kwargs)

    def start(self, timeout_s: float = 30) -> None:
        env = {**os.environ, **self.env}
        self.started = True
        if self.hosts is not None:
            self.hosts.start()
            self.hosts.run(CONTROL_HOST, ["slurmctld", "-i", "-f", str(self.conf)], env=env)
            for n in self.names:
                self.hosts.run(n, ["slurmd", "-N", n, "-f", str(self.conf)], env=env)
        else:
            subprocess.run(["slurmctld", "-i", "-f", str(self.conf)], env=env, check=True, timeout=30)
            for n in self.names:
                subprocess.run(["slurmd", "-N", n, "-f", str(self.conf)], env=env, check=True, timeout=30)
        end = time.time() + timeout_s
        while time.time() < end:
            out = self.command("sinfo", "-N", "-h", "-p", "main", "-t", "idle", "-o", "%N", check=False).stdout.split()
            if len(set(out)) == len(self.names):
                return
            time.sleep(0.3)
        raise TimeoutError(f"Slurm nodes did not come up:\n{(self.root / 'log' / 'slurmctld.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if not self.started:
            return
        self.command("scancel", "--full", "-u", os.environ.get("USER", "root"), check=False)
        time.sleep(0.5)
        for pidfile in [self.root / "slurmctld.pid", *[self.root / f"slurmd.{n}.pid" for n in self.names]]:
            try:
                pid = int(pidfile.read_text().strip())
            except (OSError, ValueError):
                continue
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
                end = time.time() + 5
                while time.time() < end and os.path.exists(f"/proc/{pid}"):
                    time.sleep(0.1)
        # A job step's slurmstepd outlives its slurmd (seen: husks of a stopped cluster's batch steps for hours).
        from pilotfill import procs

        for pid in procs.with_environment(SLURM_CONF=str(self.conf)):
            procs.kill_pid(pid)
        if self.hosts is not None:
            self.hosts.stop()  # and whatever a job left in a host's namespaces
        self.started = False

    def daemons_running(self) -> list[int]:
        """Pids of slurmctld/slurmd processes started with this cluster's config."""
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    cmd = open(f"/proc/{entry}/cmdline", "rb").read()
                except OSError:
                    continue
                if str(self.conf).encode() in cmd and (b"slurmctld" in cmd or b"slurmd" in cmd):
                    found.append(int(entry))
        return found

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (key=value fields)."""
        out = self.command("scontrol", "-o", "show", "job", job_id, check=False).stdout
        fields = {}
        for token in out.split():
            key, _, value = token.partition("=")
            fields[key] = value
        return fields
