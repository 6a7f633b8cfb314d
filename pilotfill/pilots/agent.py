"""The agent that runs inside every pilot job: the controller's hands on the pilot's nodes.

It registers the pilot's nodes with the controller, then keeps one heartbeat
waiting at the controller (a long poll): the reply comes at once when there is
something to do — start or end a job's processes on one of its nodes, give a
node back, stop — and otherwise after ``heartbeat_s``, which is how the
controller knows the pilot is alive. Processes that ended are reported with
the next heartbeat.

Every process of a job on the pilot's nodes goes through here, and here it
ends: on a ``stop`` command, when its node is given back, when the controller
that started it is replaced and the new one did not adopt its job (the new one
says which to ``keep``; the agent answers with those still ``running``), and on SIGTERM — the
batch system's preemption notice, or a cancel — which the agent first turns
into an immediate ``pilot.leaving`` (the controller reallocates at once), then
ends what runs on its nodes within the grace period, and exits only once all
of it is gone: the batch system gives the nodes to the main job as soon as the
agent's session is empty. Processes it did not start itself (ranks that
Horovod started over ssh) are found on the node by their environment, and
only processes that say they are a job's on one of its nodes
(:func:`job_processes`): the controller's own helpers — the torch store,
``horovodrun`` — may share the host and are never touched. Ending is a
:class:`Sweep`: SIGTERM to each process and everything below it (whatever
session it moved to), SIGKILL at the deadline. On PBS, processes on a sister
host run through ``pbs_tmrsh``, which forwards no signal: the agent ends them
by running itself there with ``--end-on``.

    python -m pilotfill.pilots.agent --run-dir RUN --pilot ID [--nodes a,b] [--scheduler local|slurm|pbs]
    python -m pilotfill.pilots.agent --run-dir RUN --end-on NODE[,NODE] [--job J] [--grace-s S]   # on that node's host
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import procs
from ..lease import LeaseWatch
from ..lifecycle import LeaseState
from ..protocol import PilotHeartbeat, PilotLeaving, PilotRegister
from ..schedulers.base import NodeAccess
from ..schedulers.registry import NAMES as BATCH_SYSTEM_NAMES
from ..schedulers.registry import adapter_class
from ..transport import ENDPOINT_FILE, Client, ControllerUnavailable, Interrupted, RequestRefused
from .warm import WarmLauncher, Zygote, wanted

log = logging.getLogger("pilotfill.agent")

REPLACED_READ_S = 1.0
"""While a request waits, ``controller.json`` is read at most this often: a restarted controller is asked at once, not
after the attempt to its dead predecessor times out (a heartbeat's waits past the heartbeat deadline)."""
WARM_WAIT_S = 120.0
"""The longest a pilot waits for its zygote before registering its nodes (a node that never warms is still a node)."""
WARM_CHECK_S = 2.0
"""How often a pilot without a zygote reads whether its run wants torch kept warm (``warm.json``)."""
SIGNALLED_HOLD_S = 3.0
"""A rank ended by a signal this agent did not send is told to the controller this long after: a batch system ending a
preempted pilot signals the job's steps and this agent together, and a rank's end seen first must not read as the
app's own (the pilot's leaving explains it, and the exit is then not told)."""
SIGNAL_ENDS = frozenset(
    {
        -signal.SIGTERM,
        -signal.SIGKILL,
        -signal.SIGINT,
        -signal.SIGHUP,
        128 + signal.SIGTERM,
        128 + signal.SIGKILL,
        128 + signal.SIGINT,
        128 + signal.SIGHUP,
    }
)
"""Exit codes of a process ended by a signal (negative: Popen's; 128 + N: a shell's or srun's)."""
ORPHAN_AFTER_S = 600.0
"""An agent that has heard from no controller for this long (or 60 heartbeats) ends its pilot even while the
campaign's lease is renewed (a supervisor that restarts no controller that answers)."""


class Agent:
    def __init__(
        self,
        run_dir: str,
        pilot: str,
        nodes: list[str],
        scheduler_id: str,
        heartbeat_s: float,
        grace_s: float,
        access: NodeAccess | None = None,
        deadline_s: float = 5.0,
    ):
        """``access``: how this pilot's batch system reaches its other nodes (default: the local cluster's, where every
        node is this machine)."""
        self.run_dir = str(Path(run_dir).resolve())
        self.pilot, self.nodes, self.scheduler_id = pilot, list(nodes), scheduler_id
        self.heartbeat_s, self.grace_s = heartbeat_s, grace_s
        self.access = access or NodeAccess()
        self.deadline_s = deadline_s
        self.lease = LeaseWatch(self.run_dir, deadline_s)
        self.client = Client(run_dir, timeout_s=max(heartbeat_s * 2, 10.0))
        # a job's processes get the pilot's grace to go
        self.launcher = WarmLauncher(log_dir=Path(run_dir) / "logs", grace_s=grace_s)
        # torch kept warm on this node for the jobs placed here (pilotfill.pilots.warm)
        self.zygote: Zygote | None = None
        self._warm_checked = -1e18
        self.leaving_at: float | None = None
        self.incarnation: int | None = None
        self._asking: int | None = None  # a new controller the agent turned to before hearing from it
        self._replaced_read_at = -1e18
        self._asked_running = False  # a new controller asked which of the processes it keeps still run
        self.orphan_after_s = max(ORPHAN_AFTER_S, 60 * heartbeat_s)
        self._heard_at = time.monotonic()
        self._exits: list[dict] = []
        self._held: list[tuple[float, dict]] = []  # (when to tell it, the exit): ranks signalled by someone else
        self._here = socket.gethostname().split(".")[0]
        self.python = sys.executable
        self._sweeps: list[Sweep] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._watch_sweeps, name="sweeps", daemon=True).start()
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum, frame) -> None:
        if self.leaving_at is None:
            self.leaving_at = time.time()

    # ------------------------------------------------------------ the loop

    def run(self) -> int:
        registered = False
        while True:
            if self.leaving_at is not None:
                return self._leave()
            self._keep_warm()
            gone = self._campaign_gone()
            if gone:
                return self._end(4, gone)
            try:
                if not registered:
                    self._warm_before_registering()
                    if self.leaving_at is not None:
                        continue
                    reply = self.client.request(
                        PilotRegister(self.pilot, self.nodes, self.scheduler_id, os.getpid()),
                        interrupt=self._interrupted,
                    )
                    if reply.get("stop"):
                        return self._end(0, "the controller does not want this pilot")
                    registered = True
                    log.info("registered %s", self.nodes)
                reply = self._heartbeat()
                self._heard_at = time.monotonic()
                self._follow_controller(reply.get("incarnation"), reply.get("keep"))
                if reply.get("register"):
                    registered = False  # a new controller does not know us yet
                    continue
                for command in reply.get("commands", []):  # before releases: a job's processes end on a node it leaves
                    self._do(command)
                for node in reply.get("release", []):
                    self._end_on(node)
                    if node in self.nodes:
                        self.nodes.remove(node)
                        log.info("released %s", node)
                if reply.get("stop") or not self.nodes:
                    return self._end(0, "stopped by the controller" if reply.get("stop") else "no node left")
            except Interrupted:
                continue
            except ControllerUnavailable:
                if time.monotonic() - self._heard_at > self.orphan_after_s:
                    # No controller for this long: none will come back. End the pilot rather than hold nodes idle.
                    return self._end(4, f"no controller for {self.orphan_after_s:.0f} s")
                log.warning("controller unavailable; retrying")
                self._sleep(min(1.0, self.heartbeat_s))
            except RequestRefused as exc:
                log.error("controller refused: %s", exc)
                return self._end(3, f"refused: {exc}")

    def _keep_warm(self) -> None:
        """Start the node's zygote once the run says its jobs need torch warm (checked every few seconds until then); a
        torch job's agent placed here is then forked from it, warm, instead of importing torch anew."""
        if self.zygote is not None:
            return
        now = time.monotonic()
        if now - self._warm_checked < WARM_CHECK_S:
            return
        self._warm_checked = now
        if wanted(self.run_dir):
            self.zygote = Zygote.start(
                log_path=str(Path(self.run_dir) / "logs" / f"warm-{self.pilot}.log"), run_dir=self.run_dir
            )
            self.launcher.warm = self.zygote  # what it cannot start yet (still importing) starts cold

    def _warm_before_registering(self) -> None:
        """A pilot whose run keeps torch warm registers its nodes once the zygote serves (at most :data:`WARM_WAIT_S`):
        a node offered to a job trains within a second or two, instead of importing torch while the job waits for it.
        SIGTERM cuts the wait short."""
        self._warm_checked = -1e18
        self._keep_warm()
        if self.zygote is None:
            return
        started = time.monotonic()
        while not self.zygote.ready() and self.leaving_at is None and self.zygote.proc.poll() is None:
            if time.monotonic() - started > WARM_WAIT_S:
                log.warning("torch was not warm after %.0f s: registering anyway", WARM_WAIT_S)
                return
            time.sleep(0.05)
        if self.zygote.ready():
            log.info("torch warm on this node after %.1f s", time.monotonic() - started)

    def _stop_warm(self) -> None:
        """The zygote goes once the jobs it forked have ended (they die with it: stopped first,
        it would cut their grace)."""
        if self.zygote is not None:
            self.launcher.warm = None
            self.zygote.close()
            self.zygote = None

    def _heartbeat(self) -> dict:
        """One long poll: returns when the controller has something for us, or after ``heartbeat_s``."""
        now = time.monotonic()
        for e in self.launcher.exits():
            exit_ = {"host": e.host, "job": e.job_id, "code": e.returncode, "requested": e.requested}
            if not e.requested and e.returncode in SIGNAL_ENDS:
                self._held.append((now + SIGNALLED_HOLD_S, exit_))
            else:
                self._exits.append(exit_)
        self._exits += [exit_ for at, exit_ in self._held if at <= now]
        self._held = [(at, exit_) for at, exit_ in self._held if at > now]
        exits, self._exits = self._exits, []
        running = [list(pair) for pair in sorted(self._running_jobs())] if self._asked_running else None
        message = PilotHeartbeat(self.pilot, self.heartbeat_s, exits, running)
        try:
            return self.client.request(
                message,
                timeout_s=self.heartbeat_s + 30.0,
                attempt_s=self.heartbeat_s + 10.0,
                interrupt=self._interrupted,
            )
        except BaseException:
            self._exits = exits + self._exits  # told next time
            raise

    def _leaving(self) -> bool:
        return self.leaving_at is not None

    def _interrupted(self) -> bool:
        """A request waiting for the controller stops waiting: SIGTERM, nobody is left to restart a controller, or a new
        controller listens (the old one will never answer: ask the new one)."""
        return self.leaving_at is not None or self._campaign_gone() is not None or self._replaced()

    def _replaced(self) -> bool:
        """Whether a controller other than the one this agent talks to has published itself since (it restarted)."""
        now = time.monotonic()
        if self.incarnation is None or now - self._replaced_read_at < REPLACED_READ_S:
            return False
        self._replaced_read_at = now
        try:
            incarnation = json.loads((Path(self.run_dir) / ENDPOINT_FILE).read_text()).get("incarnation")
        except (OSError, ValueError, AttributeError):
            return False
        if not isinstance(incarnation, int) or incarnation in (self.incarnation, self._asking):
            return False
        self._asking = incarnation
        self._asked_running = False  # that was the old controller's question: the new one asks its own
        log.info("controller %d replaced %d: asking it", incarnation, self.incarnation)
        return True

    def _campaign_gone(self) -> str | None:
        """Why no controller will come back for this pilot, if none will: the campaign's ``pilotfill run`` ended or is
        gone (its lease, :mod:`pilotfill.lease`) and the controller has not answered for the heartbeat deadline. A
        controller its ``pilotfill run`` restarts is waited for (the lease is renewed meanwhile)."""
        # read all along (throttled): its renewals are timed while the controller still answers
        state = self.lease.state()
        if time.monotonic() - self._heard_at <= self.deadline_s:
            return None
        if state == LeaseState.ENDED:
            return "the campaign ended"
        if state == LeaseState.GONE:
            return f"the campaign's pilotfill run is gone (no lease renewal for {self.deadline_s:.0f} s)"
        return None

    def _follow_controller(self, incarnation, keep) -> None:
        """A new controller adopts the jobs it says to ``keep`` (a list of [host, job]; none without one) and requeued
        the others: what the old one started here for those must end. While it asks, it is told which kept ones still
        run."""
        kept = {(k[0], k[1]) for k in keep if isinstance(k, list) and len(k) == 2} if isinstance(keep, list) else set()
        if isinstance(incarnation, int):
            if self.incarnation is not None and incarnation != self.incarnation:
                log.info(
                    "controller %s replaced %s: keeping %s, ending its other jobs' processes",
                    incarnation,
                    self.incarnation,
                    ", ".join(f"{j} on {h}" for h, j in sorted(kept)) or "none",
                )
                hosts_kept = {host for host, _ in kept}
                for node in self.nodes:
                    if node not in hosts_kept:
                        self._end_on(node)  # nothing of it kept: everything there ends, wherever it runs
                for host, job in sorted(self._running_jobs() - kept):
                    if host in hosts_kept:
                        self._sweep([host], job)
            self.incarnation = incarnation
        self._asked_running = isinstance(keep, list)

    def _running_jobs(self) -> set[tuple[str, str]]:
        """(node, job) of every job process on this pilot's nodes: those it started and those found by their
        environment (ranks that Horovod started over ssh)."""
        started = {(host, job) for host, job in self.launcher.running() if host in self.nodes}
        return started | set(job_processes_on(self.run_dir, self.nodes).values())

    # ------------------------------------------------------------ commands

    def _do(self, command: dict) -> None:
        op, job, host = command.get("op"), command.get("job"), command.get("host")
        if host not in self.nodes or not isinstance(job, str):
            if op != "stop":  # a stop for a node already given back has nothing left to do
                log.warning("ignored a command for %s, not a node of this pilot: %s", host, command)
            return
        if op == "start":
            argv, env = command.get("argv"), command.get("env") or {}
            if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
                log.error("ignored a start without a command line: %s", command)
                return
            env = {str(k): str(v) for k, v in env.items()}
            try:
                self.launcher.launch(host, job, self._on_node(host, job, argv, env), env)
            except OSError as exc:  # the command cannot be run here: the job loses this node, the agent goes on
                log.error("could not start %s on %s: %s", job, host, exc)
                self._exits.append({"host": host, "job": job, "code": 127, "requested": False})
                return
            log.info("started %s on %s", job, host)
        elif op == "stop":
            self._end_job(host, job)

    def _on_node(self, host: str, job: str, argv: list[str], env: dict[str, str]) -> list[str]:
        """``argv`` as run on ``host``: here, or through the batch system onto another node of this pilot."""
        if self._is_here(host):
            return argv
        return self.access.run_on(host, argv, env, self.launcher.log_path(host, job))

    def _end_job(self, host: str, job: str) -> None:
        """End a job's processes on a node: those we started, and any it started itself (found by environment)."""
        self._sweep([host], job)

    def _end_on(self, node: str) -> None:
        """End every job's processes on ``node`` (it is given back, its pilot is leaving, or its controller is gone)."""
        self._sweep([node])

    def _sweep(
        self, nodes: list[str], job: str | None = None, deadline: float | None = None, remote: bool = True
    ) -> None:
        """SIGTERM every process of ``job`` (or of any job) on ``nodes``, SIGKILL what is left at ``deadline`` (default:
        the launcher's grace) — without blocking the loop; :meth:`_end` waits for every sweep before the agent goes.

        What is swept: what the launcher started there (its whole process group), every process of this run that says
        it is a job's on one of those nodes (:func:`job_processes`), and everything below them, whatever session they
        moved to. On another host, the agent cannot see its processes, and ``pbs_tmrsh`` forwards no signal (recheck
        (c)): a sweep there runs :func:`end_here` on that host through ``pbs_tmrsh``."""
        deadline = deadline if deadline is not None else time.time() + self.launcher.grace_s
        ended = set()
        leaders = []
        for host, j in self.launcher.running():
            if host in nodes and (job is None or j == job):
                pid = self.launcher.pid(host, j)
                if pid is not None:
                    leaders.append(pid)
                self.launcher.terminate(host, j)
                ended.add((host, j))
        # elsewhere than here: none on a real cluster; on one machine, all
        found = job_processes(self.run_dir, nodes, job)
        targets = terminate([*leaders, *found], skip_groups=leaders)  # the launcher signalled its own groups
        remote = [self._end_remotely(n, job, deadline) for n in nodes if not self._is_here(n)] if remote else []
        with self._lock:
            self._sweeps.append(Sweep(targets, [r for r in remote if r is not None], deadline))
        jobs = sorted({j for _, j in ended} | set(found.values()))
        if jobs:
            log.info("ended %s on %s", ", ".join(jobs), ", ".join(nodes))

    def _is_here(self, node: str) -> bool:
        """Whether ``node``'s processes run on this machine (on the local cluster every node does)."""
        return self.access.is_here(node, self._here)

    def _end_remotely(self, node: str, job: str | None, deadline: float) -> subprocess.Popen | None:
        """``python -m pilotfill.pilots.agent --end-on NODE …`` on that node's host, where the batch system's remote
        shell forwards no signal (``pbs_tmrsh``): the signal delivered there. None where nothing more is needed."""
        end = [self.python, "-m", "pilotfill.pilots.agent", "--run-dir", self.run_dir, "--end-on", node,
               "--grace-s", f"{max(0.1, deadline - time.time()):.2f}", *(["--job", job] if job else [])]  # fmt: skip
        argv = self.access.end_on(node, end)
        if argv is None:
            return None
        try:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            log.error("could not end what runs on %s: %s", node, exc)
            return None

    def _reap_sweeps(self, wait: bool = False) -> None:
        """SIGKILL what a sweep left at its deadline; with ``wait``, block until every sweep is over
        (the agent goes)."""
        while True:
            with self._lock:
                self._sweeps = [sweep for sweep in self._sweeps if not sweep.step(time.time())]
                if not (wait and self._sweeps):
                    return
            time.sleep(0.05)

    def _watch_sweeps(self) -> None:
        while True:
            self._reap_sweeps()
            time.sleep(0.1)

    # ------------------------------------------------------------ leaving

    def _leave(self) -> int:
        """SIGTERM: tell the controller first (it moves the jobs at once), then end everything here within the grace."""
        deadline = self.leaving_at + self.grace_s
        log.info("SIGTERM: leaving by %.1f", deadline)
        code = 0
        try:
            self.client.request(PilotLeaving(self.pilot, self.nodes, deadline), timeout_s=max(0.5, self.grace_s * 0.3))
        except (ControllerUnavailable, RequestRefused) as exc:
            log.error("could not tell the controller: %s", exc)
            code = 1
        # The batch system is ending this job: on every other host of it, MOM ends the tasks it ran there (the keepers
        # and what they run) itself. Asking a sister MOM for one more task now only waits on it.
        self._end(code, "leaving", kill_at=deadline - min(1.0, self.grace_s * 0.2), remote=False)
        return code

    def _end(self, code: int, why: str, kill_at: float | None = None, remote: bool = True) -> int:
        """End every process on our nodes — SIGTERM, SIGKILL at ``kill_at`` (default: the launcher's grace) — and go
        only when all of it is gone: the batch system takes the nodes back once this agent has exited, and nothing
        of ours may still run there (recheck (a), (d): a main job waits for the pilot's whole session)."""
        log.info("ending (%s)", why)
        self._sweep(list(self.nodes), deadline=kill_at, remote=remote)
        self._reap_sweeps(wait=True)
        self.launcher.close()
        self._stop_warm()  # last: what it forked dies with it, and had the grace to end first
        # Last of the job's session: MOM sees the batch job end when its top process exits with nothing left behind.
        procs.settle_session(timeout_s=1.0)
        return code

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.leaving_at is None and time.monotonic() < end:
            time.sleep(0.05)


def job_processes(run_dir: str, nodes: list[str], job: str | None = None) -> dict[int, str]:
    """This run's job processes on ``nodes`` on this machine (pid -> job), by their environment. Each must say which
    job it is (``PILOTFILL_JOB_ID``) and which node it is on (``PILOTFILL_HOST``, or Horovod's ``HOROVOD_HOSTNAME``):
    a process that does not — the controller's torch store or horovodrun, the controller, another agent — is no
    job's, whatever host it shares (recheck (a): agents on the controller's host SIGTERMed the torch store)."""
    return {pid: owner for pid, (_, owner) in job_processes_on(run_dir, nodes, job).items()}


def job_processes_on(run_dir: str, nodes: list[str], job: str | None = None) -> dict[int, tuple[str, str]]:
    """:func:`job_processes` with the node of each: pid -> (node, job)."""
    wanted = {"PILOTFILL_JOB_ID": job} if job else {}
    found = {}
    for pid, env in procs.environments(PILOTFILL_RUN_DIR=run_dir, **wanted).items():
        on, owner = env.get("PILOTFILL_HOST") or env.get("HOROVOD_HOSTNAME"), env.get("PILOTFILL_JOB_ID")
        if owner and on in nodes:
            found[pid] = (on, owner)
    return found


def terminate(pids: list[int], skip_groups: list[int] = ()) -> dict[int, int | None]:
    """SIGTERM ``pids`` and everything below them (except members of ``skip_groups``, signalled already as groups);
    returns them all with their start times, for :class:`Sweep`."""
    targets = {p: procs.start_ticks(p) for p in dict.fromkeys([*pids, *procs.descendants(pids)]) if p != os.getpid()}
    skip = set(skip_groups)
    for pid in targets:
        if not skip or _pgid(pid) not in skip:
            procs.signal_pid(pid, signal.SIGTERM)
    return targets


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


@dataclass
class Sweep:
    """Processes told to go (SIGTERM sent), SIGKILLed with whatever they started meanwhile if still there at
    ``deadline``; ``remote``: sweeps running on other hosts (they keep the same deadline)."""

    targets: dict[int, int | None]
    remote: list[subprocess.Popen] = field(default_factory=list)
    deadline: float = 0.0
    killed: bool = False

    def step(self, now: float) -> bool:
        """Kill at the deadline; True once nothing is left (remote sweeps: waited for until just after it)."""
        self.targets = {p: t for p, t in self.targets.items() if procs.alive(p, t)}
        if self.targets and now >= self.deadline and not self.killed:
            self.killed = True
            late = {p: procs.start_ticks(p) for p in procs.descendants(list(self.targets))}
            for pid, ticks in {**self.targets, **late}.items():
                if procs.alive(pid, ticks):
                    procs.kill_pid(pid)
            self.targets.update(late)
        remote = [r for r in self.remote if r.poll() is None]
        if remote and now >= self.deadline + 0.5:
            for r in remote:  # the far side kills at the same deadline by itself; stop waiting for it
                r.kill()
                r.wait()
            remote = []
        self.remote = remote
        return not self.targets and not remote


def end_here(run_dir: str, nodes: list[str], job: str | None, grace_s: float) -> int:
    """``--end-on``: what the agent of a pilot on another host asks of this one (through ``pbs_tmrsh``): SIGTERM the
    run's processes on ``nodes`` here, SIGKILL what is left after ``grace_s``."""
    sweep = Sweep(terminate(list(job_processes(run_dir, nodes, job))), deadline=time.time() + grace_s)
    while not sweep.step(time.time()):
        time.sleep(0.05)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="pilotfill-agent", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--pilot", default=None, help="the pilot this agent is (required unless --end-on)")
    ap.add_argument(
        "--end-on",
        default=None,
        help="nodes of this host (a,b): end the run's processes there (SIGTERM, SIGKILL after --grace-s), exit",
    )
    ap.add_argument("--job", default=None, help="with --end-on: only this job's processes")
    ap.add_argument(
        "--nodes", default=None, help="comma-separated node names this pilot holds (default: ask the batch system)"
    )
    ap.add_argument(
        "--scheduler",
        default="local",
        choices=BATCH_SYSTEM_NAMES,
        help="the batch system: where to find this job's id and nodes, and how to reach them",
    )
    ap.add_argument("--scheduler-id", default=None)
    ap.add_argument("--heartbeat-s", type=float, default=1.0)
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=5.0,
        help=(
            "the controller's heartbeat deadline: how long a silent controller is waited for once its campaign is gone"
        ),
    )
    ap.add_argument("--grace-s", type=float, default=5.0)
    ap.add_argument(
        "--bin-dir",
        default=None,
        help="where the batch system's commands are: first on PATH (a batch job may have no login shell)",
    )
    args = ap.parse_args(argv)
    if args.bin_dir:
        os.environ["PATH"] = args.bin_dir + os.pathsep + os.environ.get("PATH", "")
    if args.end_on is not None:
        return end_here(
            str(Path(args.run_dir).resolve()), [n for n in args.end_on.split(",") if n], args.job, args.grace_s
        )
    if not args.pilot:
        ap.error("--pilot is required")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s agent {args.pilot} %(levelname)s %(message)s")
    # Preempted before the agent is up (PBS re-ran a requeued pilot and took it back in the same second): whatever
    # it waits on — the batch system's qstat, building the agent — is cut short; nothing of its session outlives it.
    signal.signal(signal.SIGTERM, _preempted_while_starting)
    try:
        access = adapter_class(args.scheduler).node_access()  # this batch system's job-side calls
        if args.nodes is None:
            nodes, scheduler_id = access.nodes_of_this_job(), args.scheduler_id or access.id_of_this_job()
        else:
            nodes, scheduler_id = [n for n in args.nodes.split(",") if n], args.scheduler_id or ""
        agent = Agent(
            args.run_dir,
            args.pilot,
            nodes,
            scheduler_id,
            args.heartbeat_s,
            args.grace_s,
            access=access,
            deadline_s=args.deadline_s,
        )
    except PreemptedWhileStarting:
        log.info("SIGTERM while starting: leaving before registering")
        procs.settle_session(timeout_s=min(1.0, args.grace_s))  # a child it was waiting on (qstat) goes too
        return 143
    return agent.run()


class PreemptedWhileStarting(Exception):
    """SIGTERM before the agent took over its handling: unwinds whatever the start was waiting on (a subprocess it runs
    is killed on the way out)."""


def _preempted_while_starting(signum, frame) -> None:
    raise PreemptedWhileStarting()


if __name__ == "__main__":
    sys.exit(main())
