"""A real OpenPBS 23.06.06 for the site tests, built from ``../shared/vendor/openpbs`` by ``scripts/build_openpbs.sh``.

One server host and several MOM hosts, each a virtual host of its own
(:mod:`vhosts`: its own network and UTS namespace, so its own hostname and
address, as compute nodes are):

* ``pfsrv`` runs ``pbs_server`` (with its PostgreSQL datastore, made by
  ``pbs_habitat``), ``pbs_sched`` and ``pbs_comm``; it is also the login node
  where pilotfill's controller runs;
* each MOM host runs ``pbs_mom`` with its vnodes: a host of one vnode is a plain
  node (``pfn3``); a host of several has a natural vnode with no cpus and
  one-cpu vnodes ``pfn1[0]``, ``pfn1[1]``, … (as the recordings' ``vm``);
* queues as a site with a pilot queue: ``workq`` (priority 150, the main
  workload) and ``scavenger`` (priority 10), ``preempt_order = R`` (a preempted
  pilot is requeued), job history on or off (:meth:`PbsCluster.history`);
* two normal users: :data:`USER` runs pilotfill, :data:`MAIN_USER` the main
  workload (``query_other_jobs`` on, the default, so each sees the other's jobs).

Every PBS command and daemon reads its own ``pbs.conf`` (``PBS_CONF_FILE``;
the machine's ``/etc/pbs.conf`` is never written); jobs get theirs, and the
PBS commands on ``PATH``, from each MOM's ``pbs_environment``. PBS_HOME lives
under :data:`BASE` (PBS refuses a home below a world-writable directory such
as ``/tmp``). :meth:`PbsCluster.stop` deletes every job, stops every daemon,
removes the hosts and the users' ACLs: nothing is left running.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from vhosts import Traversal, VirtualHosts, ensure_user, missing

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BUILD = REPO / "scripts" / "build_openpbs.sh"
VENDOR = Path(os.environ.get("PILOTFILL_OPENPBS_VENDOR", REPO.parent / "shared" / "vendor" / "openpbs"))
BASE = Path("/var/lib/pilotfill-tests")
SERVER = "pfsrv"
USER = "pfuser"
MAIN_USER = "pfmain"
DEFAULT_MOMS = {"pfn1": 2, "pfn2": 2, "pfn3": 1}


def unavailable() -> str | None:
    """Why a real OpenPBS cannot run here (None: it can, once built)."""
    why = missing()
    if why:
        return why
    if not (VENDOR / "SHA256SUMS").exists():
        return f"no OpenPBS source at {VENDOR} (set PILOTFILL_OPENPBS_VENDOR)"
    for tool in ("initdb_or_pg", "autoconf", "setfacl"):
        if tool == "initdb_or_pg":
            if not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
                return "PostgreSQL is not installed (OpenPBS's datastore; .ci/run installs it)"
        elif shutil.which(tool) is None:
            return f"{tool} is not installed (.ci/run installs OpenPBS's build packages)"
    return None


def build() -> Path:
    """The OpenPBS install prefix, built once per machine (keyed by the source's checksum)."""
    proc = subprocess.run([str(BUILD), str(VENDOR)], capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/build_openpbs.sh failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


class PbsCluster:
    """``PbsCluster(prefix)``: ``start()``, then ``qsub(...)`` / ``run(argv, user=...)`` / ``jobs()``; ``stop()``."""

    def __init__(self, prefix: Path, moms: dict[str, int] | None = None, grace_s: int = 5):
        self.prefix = Path(prefix)
        self.moms = dict(moms or DEFAULT_MOMS)
        self.grace_s = grace_s
        BASE.mkdir(parents=True, exist_ok=True)
        BASE.chmod(0o755)
        self.root = Path(tempfile.mkdtemp(prefix="pbs-", dir=BASE))
        self.root.chmod(0o755)
        self.hosts = VirtualHosts([SERVER, *self.moms])
        self.traversal = Traversal()
        self.homes = {u: self.root / "home" / u for u in (USER, MAIN_USER)}
        self.started = False

    # ------------------------------------------------------------ names

    @property
    def vnodes(self) -> list[str]:
        """Every vnode that can run a job, in host order."""
        return [v for host, n in self.moms.items() for v in self.vnodes_of(host)]

    def vnodes_of(self, host: str) -> list[str]:
        n = self.moms[host]
        return [host] if n == 1 else [f"{host}[{i}]" for i in range(n)]

    def conf(self, host: str) -> Path:
        return self.root / f"{host}.conf"

    def home(self, host: str) -> Path:
        return self.root / host

    def env(self, host: str = SERVER, **extra: str) -> dict[str, str]:
        """What a login shell on ``host`` has: the PBS commands on PATH, that host's pbs.conf."""
        path = f"{self.prefix}/bin:{self.prefix}/sbin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
        return {"PATH": path, "PBS_CONF_FILE": str(self.conf(host)), "LANG": "C.UTF-8", **extra}

    # ------------------------------------------------------------ life cycle

    def start(self) -> None:
        self.started = True
        self.hosts.start()
        for user, home in self.homes.items():
            ensure_user(user, home)
        # The users run this checkout's Python (under /root when it is pyenv's) and PBS's setuid pbs_iff.
        self.traversal.grant([USER, MAIN_USER], [Path(sys.executable).resolve(), Path(sys.prefix), REPO, self.prefix])
        self._write_conf(SERVER, PBS_START_SERVER=1, PBS_START_SCHED=1, PBS_START_COMM=1)
        for host in self.moms:
            self._write_conf(host, PBS_START_MOM=1)
        self._habitat(SERVER)
        for host in self.moms:
            self._habitat(host)
            self._configure_mom(host)
        self.run([f"{self.prefix}/sbin/pbs_comm"])
        self.run([f"{self.prefix}/sbin/pbs_server"], timeout=120)
        self.run([f"{self.prefix}/sbin/pbs_sched"])
        self._wait(lambda: self.run(["qstat", "-B"], check=False).returncode == 0, 60, "pbs_server to answer")
        for host in self.moms:
            self.qmgr(f"create node {host}")
            self.hosts.run(host, [f"{self.prefix}/sbin/pbs_mom"], env=self.env(host), timeout=60)
        for command in (
            "set queue workq priority = 150",
            "create queue scavenger queue_type = execution, priority = 10, enabled = True, started = True",
            "set sched preempt_order = R",
            "set server job_history_enable = False",
            "set server scheduler_iteration = 60",
            "set server node_fail_requeue = 0",
        ):
            self.qmgr(command)
        self._wait(lambda: self.free() == set(self.vnodes), 90, f"every vnode free ({', '.join(self.vnodes)})")

    def stop(self) -> None:
        if not self.started:
            return
        try:
            ids = self.run(["qselect"], check=False).stdout.split()
            if ids:
                self.run(["qdel", "-W", "force", *ids], check=False)
            self.run(["qterm", "-t", "quick", "-m", "-s", "-f"], check=False, timeout=60)
        except (subprocess.TimeoutExpired, OSError):
            pass
        self.hosts.stop()  # whatever did not stop (the datastore's postgres included) is killed with its namespace
        self.traversal.undo()
        shutil.rmtree(self.root, ignore_errors=True)
        self.started = False

    # ------------------------------------------------------------ commands

    def run(self, argv: Sequence[str], user: str | None = None, host: str = SERVER, check: bool = True, timeout: float = 60,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:  # fmt: skip
        """``argv`` on ``host`` as ``user`` (root by default), with that host's PBS environment (plus ``env``)."""
        return self.hosts.run(host, argv, user=user, env={**self.env(host), **(env or {})}, check=check, timeout=timeout,
                              cwd=str(self.homes[user]) if user else None)  # fmt: skip

    def qmgr(self, command: str) -> str:
        return self.run(["qmgr", "-c", command]).stdout

    def qsub(self, *argv: str, user: str = MAIN_USER) -> str:
        """Submit as ``user`` (the main workload by default); the job id."""
        return self.run(["qsub", *argv], user=user).stdout.strip()

    def history(self, on: bool) -> None:
        self.qmgr(f"set server job_history_enable = {'True' if on else 'False'}")

    def jobs(self, history: bool = False) -> dict[str, dict]:
        argv = ["qstat", *(["-x"] if history else []), "-f", "-F", "json"]
        out = self.run(argv, check=False).stdout
        return json.loads(out).get("Jobs", {}) if out.strip() else {}

    def job(self, job_id: str) -> dict | None:
        return self.jobs(history=True).get(job_id) or self.jobs().get(job_id)

    def nodes(self) -> dict[str, dict]:
        return json.loads(self.run(["pbsnodes", "-av", "-F", "json"]).stdout).get("nodes", {})

    def free(self) -> set[str]:
        """Vnodes free and without a job."""
        try:
            nodes = self.nodes()
        except (AssertionError, ValueError):
            return set()
        return {n for n, v in nodes.items() if v.get("state") == "free" and not v.get("jobs") and n in self.vnodes}

    def server_log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted((self.home(SERVER) / "server_logs").glob("*")))

    def mom_log(self, host: str) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted((self.home(host) / "mom_logs").glob("*")))

    def reset(self) -> None:
        """Between tests: no job left (deleted, forced), every vnode free, history off, queues as at the start."""
        ids = self.run(["qselect"], check=False).stdout.split()
        if ids:
            self.run(["qdel", "-W", "force", *ids], check=False)
        self._wait(lambda: not self.run(["qselect"], check=False).stdout.split(), 60, "every job to go")
        for command in ("set server job_history_enable = False", "unset queue scavenger max_queued"):
            self.run(["qmgr", "-c", command], check=False)
        self._wait(lambda: self.free() == set(self.vnodes), 60, "every vnode free again")

    # ------------------------------------------------------------ helpers

    def _write_conf(self, host: str, **start: int) -> None:
        lines = {
            "PBS_SERVER": SERVER, "PBS_START_SERVER": 0, "PBS_START_SCHED": 0, "PBS_START_COMM": 0, "PBS_START_MOM": 0,
            "PBS_EXEC": self.prefix, "PBS_HOME": self.home(host), "PBS_CORE_LIMIT": "unlimited", "PBS_SCP": "/usr/bin/scp", **start,
        }  # fmt: skip
        self.conf(host).write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
        self.conf(host).chmod(0o644)

    def _habitat(self, host: str) -> None:
        """``pbs_habitat``: PBS_HOME made by ``pbs_postinstall``; on the server host, the datastore and the server's
        first start (``pbs_server -t create``, the default queue ``workq``)."""
        proc = self.hosts.run(host, [f"{self.prefix}/libexec/pbs_habitat"], env=self.env(host), check=False, timeout=300)
        if proc.returncode != 0 or not (self.home(host) / "pbs_version").exists():
            raise RuntimeError(f"pbs_habitat on {host} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")

    def _configure_mom(self, host: str) -> None:
        home = self.home(host)
        (home / "mom_priv" / "config").write_text(f"$clienthost {SERVER}\n$usecp *:/ /\n")
        # A job's environment: the PBS commands, this host's pbs.conf (pbs_tmrsh, qstat inside the job).
        (home / "pbs_environment").write_text(f"TZ=UTC\nPATH={self.prefix}/bin:/usr/local/bin:/usr/bin:/bin\nPBS_CONF_FILE={self.conf(host)}\n")
        # Vnodes as a site defines them (pbs_mom -s insert): one plain node of one cpu, or a natural vnode with no cpus
        # and one-cpu vnodes host[i] (what pbsnodes showed of the recordings' multi-vnode hosts).
        if self.moms[host] == 1:
            spec = [f"{host}: resources_available.ncpus = 1", f"{host}: resources_available.mem = 2gb"]
        else:
            spec = [f"{host}: resources_available.ncpus = 0"]
            for v in self.vnodes_of(host):
                spec += [f"{v}: resources_available.ncpus = 1", f"{v}: resources_available.mem = 2gb"]
        path = self.root / f"vnodes-{host}"
        path.write_text("$configversion 2\n" + "\n".join(spec) + "\n")
        self.hosts.run(host, [f"{self.prefix}/sbin/pbs_mom", "-s", "insert", f"vnodes_{host}", str(path)], env=self.env(host))

    @staticmethod
    def _wait(predicate, timeout_s: float, what: str) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if predicate():
                return
            time.sleep(0.3)
        raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def site_config(runtime: str = "processes", nodes_per_pilot: int = 2, grace_s: float = 5.0, **sections: dict) -> str:
    """A pilotfill config for this cluster, as a site would write it for ``scavenger``: controller and torch store
    reachable from the MOM hosts (``controller.bind``), gloo over the hosts' link (``eth0``). ``sections``: more
    keys per section, e.g. ``pbs={"extra_args": ["-l", "nosuchres=1"]}``."""
    base: dict[str, dict] = {
        "pbs": {"queue": "scavenger", "min_walltime": "00:05:00", "max_walltime": "01:00:00", "nodes_per_pilot": nodes_per_pilot,
                "chunk": "ncpus=1", "place": "vscatter", "poll_s": 1.0, "command_timeout_s": 30.0},
        "pilots": {"heartbeat_s": 1.0, "heartbeat_deadline_s": 15.0, "grace_s": grace_s, "nodes_per_pilot": nodes_per_pilot,
                   "max_queued_pilots": 4, "max_submits_per_minute": 12},
        "controller": {"tick_s": 0.2, "bind": "0.0.0.0"},
        "runtime": {"kind": runtime, "ranks_per_node": 1, "network_interface": "eth0"},
    }  # fmt: skip
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    lines = ['scheduler = "pbs"']
    for name, values in base.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


class Campaign:
    """A ``pilotfill run`` of ``code`` with ``config`` as :data:`USER` on the server host (the login node), in a
    directory of its own in the user's home, its own session and process group (Ctrl-C reaches all of it)."""

    def __init__(self, cluster: PbsCluster, name: str, code: str, config: str):
        import pwd

        self.cluster = cluster
        self.dir = cluster.homes[USER] / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = self.dir / "run"
        self.output, self.errors = self.dir / "pilotfill.out", self.dir / "pilotfill.err"
        (self.dir / "campaign.py").write_text(code)
        (self.dir / "site.toml").write_text(config)
        pw = pwd.getpwnam(USER)
        for path in (self.dir, self.dir / "campaign.py", self.dir / "site.toml"):
            os.chown(path, pw.pw_uid, pw.pw_gid)
        self.proc: subprocess.Popen | None = None

    def start(self, **env: str) -> subprocess.Popen:
        argv = [sys.executable, "-m", "pilotfill", "run", "campaign.py", "--config", "site.toml", "--run-dir", str(self.run_dir)]
        with open(self.output, "wb") as out, open(self.errors, "wb") as err:
            self.proc = self.cluster.hosts.popen(SERVER, argv, user=USER, env={**self.cluster.env(), "COLUMNS": "200", **env}, cwd=str(self.dir),
                                                 stdout=out, stderr=err, start_new_session=True)  # fmt: skip
        return self.proc

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"pilotfill run did not end within {timeout_s:.0f} s:\n{self.text()[-4000:]}") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()

    def stdout(self) -> str:
        """What the campaign's script printed."""
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def text(self) -> str:
        """What ``pilotfill run`` said (progress, summary, errors: its stderr), after what the script printed."""
        return self.stdout() + (self.errors.read_text(errors="replace") if self.errors.exists() else "")

    def events(self, kind: str | None = None) -> list[dict]:
        return self._read(lambda state: state.events(kind))

    def training_nodes(self) -> set[str]:
        """The nodes (vnodes) the campaign's running jobs hold now, as the controller recorded them."""
        return self._read(lambda state: {n for job in state.jobs(("running",)) for n in job.nodes}) or set()

    def _read(self, query):
        """``query(state)`` on the run's journal; empty ([]) before the controller has written it."""
        from pilotfill.journal import Journal

        try:
            state = Journal(self.run_dir, readonly=True)
        except FileNotFoundError:  # no file yet, or the controller made it and has not written its tables yet
            return []
        try:
            return query(state)
        finally:
            state.close()

    def pilot_jobs(self) -> list[str]:
        """PBS job ids of every pilot the campaign submitted."""
        return [e["data"]["scheduler_id"] for e in self.events("pilot.submitted")]

    def live_pilots(self) -> dict[str, dict]:
        """The campaign's pilots PBS still has (not finished)."""
        mine = set(self.pilot_jobs())
        return {j: v for j, v in self.cluster.jobs().items() if j in mine and v.get("job_state") != "F"}

    def __enter__(self) -> Campaign:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
