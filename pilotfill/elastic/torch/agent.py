"""One torch elastic agent per node of a job, started on its node by that node's pilot agent.

    PILOTFILL_RUN_DIR=RUN python -m pilotfill.elastic.torch.agent --job-id J --host H --nproc N
        [--min-nodes A --max-nodes B] [--gpus-per-node G] [--stop-grace S] [--collective-timeout T]

torch's ``LocalElasticAgent`` with the ``pilotfill`` rendezvous backend
(:mod:`pilotfill.elastic.torch.rdzv`) and N workers running
:func:`pilotfill.elastic.torch.worker.entry`. Each worker gets torchrun's
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT (the run's
store on the controller's machine) and TORCHELASTIC_*, plus PILOTFILL_RUN_DIR,
PILOTFILL_JOB_ID, PILOTFILL_HOST, PILOTFILL_RUNTIME=torch, the round's store
prefix and, on a node with GPUs, its own device: CUDA_VISIBLE_DEVICES is one
GPU of the node's (by local rank), so every rank uses ``cuda:0``. Every worker
also gets the NCCL error handling and collective timeout of
:mod:`pilotfill.elastic.collectives`.

What makes a restart fast (torchrun respawns its workers cold; ``benchmarks/bench_elastic.py`` times both):

* workers are forked from a forkserver that has already imported torch,
  ``torch._dynamo`` (the first optimizer's hidden import), pilotfill and the
  job's own module (:mod:`pilotfill.elastic.torch.preload`), so a new worker
  skips seconds of imports; and a new node joins only once its forkserver is
  warm, so the others do not stop training to wait for it;
* membership changes are heard from the controller (``rdzv.poll``, at most
  every 0.2 s) instead of from keep-alives and timeouts, and a round closes as
  soon as its hosts have joined (no ``last_call_timeout``);
* ranks are assigned without a store round trip (all nodes run the same number).

Workers are stopped with SIGTERM and get the pilot's grace (``--stop-grace``:
the site config's ``pilots.grace_s``) before SIGKILL — on a restart and on the
agent's own end — so code that commits on SIGTERM has the time the batch
system gives (torchrun's agent kills after 30 s whatever the site's grace,
pytorch/pytorch#119856). Code that does not handle SIGTERM ends at once.

SIGTERM (the node is released or preempted) ends the workers within the grace
and the agent exits 143.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import math
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from enum import Enum
from multiprocessing import forkserver
from pathlib import Path

from ...procs import die_with_parent
from ...protocol import JobGet, RdzvJoin, RdzvPoll
from ...transport import ControllerUnavailable, RequestRefused
from ..collectives import DEFAULT_TIMEOUT_S, worker_environment

log = logging.getLogger("pilotfill.torch_agent")

STOP_GRACE_S = 5.0
"""Workers get this long after SIGTERM before SIGKILL, on restarts and on the agent's own end, unless told the pilot's
grace (``--stop-grace``, which the torch runtime always passes)."""
MONITOR_INTERVAL_S = 0.1
JOB_OVER = 1
"""A worker's exit status once the job's failure is told to the controller (its own error, or a peer's it saw)."""
REPORTED_CODES = (JOB_OVER, 75)
"""Worker exit statuses pilotfill's own code gives (1: reported or judged, 75: a lost peer, re-form)."""


class WorkerEnded(Exception):
    """A worker ended in a way pilotfill's code does not report; ``code``: its exit status (negative: a signal)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def gpu_list(gpus_per_node: int | None) -> list[str]:
    """This node's GPUs as CUDA_VISIBLE_DEVICES entries: the first G of those we may use (all, if G is None)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    elif gpus_per_node is not None:
        devices = [str(i) for i in range(gpus_per_node)]
    else:
        try:
            devices = [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
        except OSError:
            devices = []
    return devices if gpus_per_node is None else devices[:gpus_per_node]


def entry_module(run_dir: str, job_id: str) -> str | None:
    """The job's own module (to preload in the forkserver), if the job names one and it can be found."""
    from ...transport import Client

    try:
        spec = Client(run_dir, timeout_s=10).request(JobGet(job_id))["job"]["spec"]
    except Exception as exc:  # the workers will report what is wrong
        log.warning("job.get for preloading failed: %s", exc)
        return None
    module = (spec.get("entry") or "").partition(":")[0]
    try:
        return module if module and importlib.util.find_spec(module) is not None else None
    except (ImportError, ValueError):
        return None


def _noop() -> None:
    pass


def start_forkserver(job_module: str | None, warm: bool = False) -> threading.Thread | None:
    """Start the forkserver importing torch and the job's module once; the thread ends when it is warm.

    The agent joins the rendezvous only after that: joining makes the other
    nodes restart their workers, which would otherwise wait for ours to import.
    Meanwhile the agent imports torch itself (the two overlap). ``warm``: this
    agent was forked from its pilot's zygote with torch imported and no thread
    started: the forkserver is forked from it too (:func:`fork_forkserver`), warm
    at once; it imports only the job's module. Returns None then.
    """
    if job_module:
        os.environ["PILOTFILL_PRELOAD_MODULE"] = job_module
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["pilotfill.elastic.torch.preload"])
    if warm:
        fork_forkserver(["pilotfill.elastic.torch.preload"])
        return None
    # Started from this (the main) thread: the forkserver dies with its parent thread (preload.py sets
    # PR_SET_PDEATHSIG), and the warming thread below ends at once. Its workers die with it in turn.
    forkserver.ensure_running()

    def warm_up() -> None:
        probe = ctx.Process(target=_noop)
        probe.start()  # returns once the forkserver has preloaded and forked
        probe.join()

    thread = threading.Thread(target=warm_up, name="forkserver-warm", daemon=True)
    thread.start()
    return thread


def fork_forkserver(preload: list[str]) -> None:
    """multiprocessing's forkserver, forked from this process rather than started as a new Python (which would import
    torch again): ``ForkServer.ensure_running`` as CPython 3.11 does it, with ``os.fork`` for its ``spawnv_passfds``.
    Only from a process with no thread of its own yet (a fork keeps the calling thread alone)."""
    import socket
    from multiprocessing import connection, resource_tracker

    server = forkserver._forkserver
    if server._forkserver_pid is not None:
        return
    resource_tracker.ensure_running()
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(alive_w)
                forkserver.main(listener.fileno(), alive_r, preload)
            finally:
                os._exit(0)
        os.close(alive_r)
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid
    server._preload_modules = list(preload)


def make_agent(args: argparse.Namespace, run_dir: str):
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    from . import rdzv, worker

    gpus = gpu_list(args.gpus_per_node)
    grace = max(1, math.ceil(args.stop_grace))  # torch's shutdown timeouts are whole seconds

    class PilotfillAgent(LocalElasticAgent):
        """torch's agent plus what each worker needs from pilotfill in its environment."""

        def _set_local_rank_env(self, worker_env, local_rank, spec):  # torch's per-worker environment hook
            super()._set_local_rank_env(worker_env, local_rank, spec)
            rnd = handler.round
            worker_env["PILOTFILL_RDZV_PREFIX"] = rnd.worker_prefix if rnd is not None else ""
            worker_env["PILOTFILL_RDZV_ROUND"] = str(rnd.number if rnd is not None else -1)
            if gpus:
                worker_env["CUDA_VISIBLE_DEVICES"] = gpus[local_rank % len(gpus)]

        def _invoke_run(self, role: str = "default"):
            # Again after a re-form that _exit_barrier joined (this node's workers had returned early).
            while True:
                self._pilotfill_reform = False
                result = super()._invoke_run(role)
                if not self._pilotfill_reform:
                    return result

        def _exit_barrier(self) -> None:
            # This node's workers returned. The job's end is rank 0's result, which the controller hears: wait for its
            # word, or for the round to change (a peer re-forms: this node joins it), not for torch's store barrier,
            # which times out and takes the node out of the job.
            self._pilotfill_reform = handler.wait_for_change()
            if self._pilotfill_reform:
                log.info("%s: the round changed while this node's workers had returned: joining the next", args.host)

        def _monitor_workers(self, worker_group):
            # A worker that ended in a way no pilotfill code reports (a signal: a segfault, the OOM killer; os._exit)
            # is the app's own end: this agent leaves with that status instead of restarting it up to max_restarts
            # times, and the controller counts such ends (a few in a row with nothing committed fail the job).
            result = super()._monitor_workers(worker_group)
            if not result.is_failed() and _exited_without_returning(self._pcontext):
                raise WorkerEnded(0)
            if result.is_failed():
                for failure in result.failures.values():
                    code = failure.exitcode
                    if code is not None and (
                        (code < 0 and -code not in (signal.SIGTERM, signal.SIGINT))
                        or code not in REPORTED_CODES and code > 0
                    ):
                        raise WorkerEnded(code)
            return result

        def _stop_workers(self, worker_group) -> None:  # a restart; torch's waits up to 30 s for workers to go
            self._shutdown(timeout=grace, restart=True)

        def _shutdown(self, *args, restart: bool = False, **kwargs) -> None:
            if not restart:
                # the agent's own end: a second SIGTERM (the pilot agent's, the batch system's) must not cut the grace
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    signal.signal(sig, signal.SIG_IGN)  # torch's handler would raise out of the wait for the workers
            super()._shutdown(*args, **kwargs)

    for hook in (
        "_set_local_rank_env",
        "_stop_workers",
        "_shutdown",
        "_invoke_run",
        "_exit_barrier",
        "_monitor_workers",
    ):
        if not hasattr(LocalElasticAgent, hook):
            raise RuntimeError(
                f"this torch's LocalElasticAgent has no {hook}: pilotfill's agent is written for torch 2.13"
            )
    params = RendezvousParameters(
        backend=rdzv.BACKEND, endpoint=run_dir, run_id=args.job_id, min_nodes=args.min_nodes, max_nodes=args.max_nodes,
        host=args.host, poll_interval=args.poll_interval,
    )  # fmt: skip
    handler = get_rendezvous_handler(params)
    spec = WorkerSpec(
        role="trainer", local_world_size=args.nproc, rdzv_handler=handler, entrypoint=worker.entry, args=(),
        max_restarts=args.max_restarts, monitor_interval=args.monitor_interval,
    )  # fmt: skip
    log_dir = Path(run_dir) / "logs" / "torchelastic" / f"{args.job_id}.{args.host}"
    agent = PilotfillAgent(spec, logs_specs=DefaultLogsSpecs(log_dir=str(log_dir)), start_method="forkserver",
                           shutdown_timeout=grace)  # fmt: skip
    return agent, handler


def _exited_without_returning(pcontext) -> bool:
    """Whether a worker's process ended with status 0 before handing back its function's return value (``os._exit(0)``):
    torch waits for every return value, so it would count such a worker as running for ever. A worker that returns
    hands its value over and then waits for the others, so it never ends first."""
    processes = getattr(getattr(pcontext, "_pc", None), "processes", None) or ()
    returned = getattr(pcontext, "_return_values", {})
    finished = getattr(pcontext, "_worker_finished_event", None)
    if finished is None or finished.is_set():
        return False
    return any(p.exitcode == 0 and i not in returned for i, p in enumerate(processes))


class AgentPhase(str, Enum):
    """Where an in-place agent stands (:class:`InPlaceAgent`)."""

    # its workers wait for a round (a fresh start: before they run; provisional: parked at their first batch)
    JOINING = "joining"
    RUNNING = "running"  # its workers train in its round; a newer round is handed to them at their next boundary
    RETURNED = "returned"  # its workers returned, or told the job's failure: waiting for the job's end or a new round
    LEAVING = "leaving"  # told to go (SIGTERM) or no longer in the job: its workers leave at their next boundary


AGENT_MOVES: dict[AgentPhase, frozenset[AgentPhase]] = {
    AgentPhase.JOINING: frozenset({AgentPhase.RUNNING, AgentPhase.LEAVING, AgentPhase.JOINING, AgentPhase.RETURNED}),
    AgentPhase.RUNNING: frozenset({AgentPhase.RUNNING, AgentPhase.JOINING, AgentPhase.RETURNED, AgentPhase.LEAVING}),
    AgentPhase.RETURNED: frozenset({AgentPhase.JOINING, AgentPhase.LEAVING}),
    AgentPhase.LEAVING: frozenset({AgentPhase.LEAVING}),
}
TICK_S = 0.02
REFORM_ASK_S = 3.0
JOIN_RETRY_S = 0.05
"""A join answered "wait" (the round waits for its other hosts) is asked again this often until the round closes."""
"""A worker that waits this long for a round nobody opened (a collective failed with every node still there) has its
agent ask for one: the same hosts, re-formed."""


class InPlaceAgent:
    """A node's agent whose workers outlive membership changes (:mod:`pilotfill.elastic.torch.inplace`).

    It starts its workers from the warm forkserver — after the first round closes for a job's first start, or at
    once, *provisional*, for a job whose ranks already train in place (they run their prologue alone and wait at
    their first batch) — and joins the controller's rounds for them: a newer round is written to the node's notice
    and the workers move to it at their next step boundary, without stopping. Joining waits until the workers are
    ready (parked at their first batch, or formed in the last round), so the others never wait for this node. A
    worker that fails (a lost peer, its own error) is started again, provisional: it resumes from a peer, or from
    the commit the node holds in memory. Workers whose code reaches no loader boundary are restarted into each new
    round, as torch elastic would. SIGTERM: the workers leave at their next boundary (they got it too), within the
    grace; then SIGKILL."""

    def __init__(self, args: argparse.Namespace, run_dir: str, client) -> None:
        from . import inplace

        self.args, self.run_dir, self.client = args, run_dir, client
        self.gpus = gpu_list(args.gpus_per_node)
        self.phase = AgentPhase.JOINING
        self.round = -1
        self.round_info: dict | None = None
        self.serial = 0
        # this job's ranks re-form in place (its workers reached a loader boundary, or the book says so)
        self.in_place = False
        self.workers: dict[int, multiprocessing.process.BaseProcess] = {}
        self.provisional = False
        self.restarts = 0
        self.term_at: float | None = None
        self.deadline: float | None = None
        self._polled = 0.0
        self._join_asked: float | None = None  # a join of a newer round answered "wait": asked again every JOIN_RETRY_S
        self._join_waits_since = 0.0
        self._nudged: float | None = None
        self._joining_since: float | None = None
        self._want_since: float | None = None
        self.ctx = multiprocessing.get_context("forkserver")
        # node-local memory: notices and the commit it holds
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.dir = Path(tempfile.mkdtemp(prefix=f"pilotfill-{args.job_id}-{args.host}-", dir=base))
        self.notice_path = self.dir / inplace.NOTICE
        self._inplace = inplace

    # ------------------------------------------------------------ the loop

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_term)
        try:
            return self._run()
        finally:
            self._kill_workers()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _run(self) -> int:
        first = self._poll(-1)
        self.in_place = bool(first and first.get("in_place"))
        if self.in_place:
            self._spawn(provisional=True)  # they run their prologue now, alone; this node joins once they are ready
        while True:
            if self.term_at is not None and self.phase is not AgentPhase.LEAVING:
                self._move(AgentPhase.LEAVING)
                self._tell_leave()
            code = self._reap()
            if code is not None:
                return code
            if self.phase is AgentPhase.LEAVING:
                if not self._alive():
                    return 143 if self.term_at is not None else 0
                if self.deadline is not None and time.monotonic() > self.deadline:
                    log.warning("%s: workers did not leave within the grace: killing them", self.args.host)
                    self._kill_workers()
                    return 143 if self.term_at is not None else 0
            elif self.phase is AgentPhase.JOINING:
                self._joining()
            elif self.phase is AgentPhase.RUNNING:
                self._running()
            elif self.phase is AgentPhase.RETURNED:
                if self._waited_for_change():
                    return 0
            time.sleep(TICK_S)

    # ------------------------------------------------------------ phases

    def _joining(self) -> None:
        """Join the round once the workers are ready for it (a fresh start: at once)."""
        if self.workers and not all(self._ready(i) for i in self.workers if self.workers[i].is_alive()):
            return
        reply = self._join()
        if reply is None:
            return
        state = reply.get("state")
        if state == "ended":
            log.info("%s: no part in %s any more: leaving", self.args.host, self.args.job_id)
            self._move(AgentPhase.LEAVING)
            self._tell_leave()
            return
        if state != "closed":
            return
        self._closed(reply)
        if not self.workers:
            self._spawn(provisional=False)
        self._move(AgentPhase.RUNNING)

    def _running(self) -> None:
        """Hear of newer rounds from the controller (every poll interval, at once when a worker asks) and join them;
        workers that never reached a boundary are restarted into the new round instead."""
        self._learn_capable()
        nudged = self._nudge_time()
        asked = nudged is not None and nudged != self._nudged
        self._nudged = nudged
        wants = self._workers_want()
        if wants and self._want_since is None:
            self._want_since = time.monotonic()
        elif not wants:
            self._want_since = None
        if self._join_asked is not None and time.monotonic() - self._join_waits_since > REFORM_ASK_S:
            self._join_asked = None  # a host that never joins: back to asking at the poll interval
        if self._join_asked is not None:
            if time.monotonic() - self._join_asked < JOIN_RETRY_S:
                return  # the round closes when its last host joins: this one hears it at its next ask, not a poll later
        else:
            if not asked and time.monotonic() - self._polled < self.args.poll_interval:
                return
            reply = self._poll(self.round)
            if reply is None:
                return
            if not reply.get("current") or not reply.get("member", True):
                log.info(
                    "%s: no part in %s any more: its workers leave at their next step", self.args.host, self.args.job_id
                )
                self._move(AgentPhase.LEAVING)
                self._tell_leave()
                return
            changed = int(reply.get("waiting") or 0) > 0 or reply.get("current") != self.round
            stuck = self._want_since is not None and time.monotonic() - self._want_since > REFORM_ASK_S
            if not (changed or stuck):
                return
            if not all(self._formed(i) for i in self.workers if self.workers[i].is_alive()):
                # its workers are still moving to the last round: one move at a time, so every rank goes to the same
                return
        reply = self._join()  # a newer round; or, stuck, the same hosts re-formed (the book opens one)
        waits = reply is not None and reply.get("state") == "wait"
        if waits and self._join_asked is None:
            self._join_waits_since = time.monotonic()
        self._join_asked = time.monotonic() if waits else None
        if reply is None or reply.get("state") == "wait":
            return
        if reply.get("state") == "ended":
            self._move(AgentPhase.LEAVING)
            self._tell_leave()
            return
        self._want_since = None
        if self.in_place:
            self._closed(reply)  # the workers move at their next boundary
            return
        log.info("%s: round %s: restarting workers that reach no loader boundary", self.args.host, reply.get("round"))
        self._stop_workers()
        self._closed(reply)
        self._spawn(provisional=False)

    def _waited_for_change(self) -> bool:
        """The node's workers returned: True once the job is over (this agent goes); a new round starts them again."""
        if time.monotonic() - self._polled < self.args.poll_interval:
            return False
        reply = self._poll(self.round)
        if reply is None:
            return False
        if not reply.get("current") or not reply.get("member", True):
            return True
        if int(reply.get("waiting") or 0) > 0 or reply.get("current") != self.round:
            log.info("%s: the round changed while this node's workers had returned: joining the next", self.args.host)
            self.workers.clear()
            self._move(AgentPhase.JOINING)
        return False

    # ------------------------------------------------------------ workers

    def _spawn(self, provisional: bool) -> None:
        from . import worker

        self.provisional = provisional
        if provisional:
            # they wait for the round this agent joins next, not the last one's
            self.notice_path.unlink(missing_ok=True)
        for local_rank in range(self.args.nproc):
            self._inplace.worker_status_path(self.dir, local_rank).unlink(missing_ok=True)
            self._inplace.returned_path(self.dir, local_rank).unlink(missing_ok=True)
            env = self._worker_env(local_rank, provisional)
            proc = self.ctx.Process(
                target=worker.entry_in_place, args=(env,), name=f"worker-{local_rank}", daemon=False
            )
            proc.start()
            self.workers[local_rank] = proc

    def _worker_env(self, local_rank: int, provisional: bool) -> dict[str, str]:
        env = {
            "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(self.args.nproc), "ROLE_NAME": "trainer",
            "TORCHELASTIC_RUN_ID": self.args.job_id, "TORCHELASTIC_RESTART_COUNT": str(self.restarts),
            "TORCHELASTIC_MAX_RESTARTS": str(self.args.max_restarts), "PILOTFILL_RESIZE": "in_place",
            "PILOTFILL_NOTICE_DIR": str(self.dir), "PILOTFILL_PROVISIONAL": "1" if provisional else "0",
        }  # fmt: skip
        info = self.round_info
        if info is not None and not provisional:
            nodes, node_rank, store = int(info["world_size"]), int(info["rank"]), info["store"]
            env.update(
                {
                    "RANK": str(node_rank * self.args.nproc + local_rank),
                    "WORLD_SIZE": str(nodes * self.args.nproc),
                    "GROUP_RANK": str(node_rank),
                    "GROUP_WORLD_SIZE": str(nodes),
                    "ROLE_RANK": str(node_rank * self.args.nproc + local_rank),
                    "ROLE_WORLD_SIZE": str(nodes * self.args.nproc),
                    "MASTER_ADDR": store["host"],
                    "MASTER_PORT": str(store["port"]),
                    "PILOTFILL_RDZV_PREFIX": f"{store['prefix']}/workers",
                    "PILOTFILL_RDZV_ROUND": str(info["round"]),
                }
            )
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus[local_rank % len(self.gpus)]
        return env

    def _reap(self) -> int | None:
        """Workers that ended: the agent's exit status if it must go now, else None
        (they are started again as needed)."""
        from .inplace import EXIT_LEFT
        from .worker import EXIT_PEER_LOST

        ended = {i: p.exitcode for i, p in self.workers.items() if not p.is_alive()}
        if not ended:
            return None
        for i, code in ended.items():
            self.workers[i].join(0)
            if code is None:
                continue
            own_end = (
                code < 0 and -code not in (signal.SIGTERM, signal.SIGINT)
                or code > 0 and code not in (*REPORTED_CODES, EXIT_LEFT)
            )
            # os._exit(0): no value, no error
            own_end = own_end or code == 0 and not self._inplace.returned_path(self.dir, i).exists()
            if own_end and self.phase is not AgentPhase.LEAVING:
                # The app's own end (a segfault, the OOM killer, its exit status): leave with it; the controller counts.
                from ..ending import exit_words

                log.error(
                    "%s: a worker %s: leaving (the controller counts such ends)", self.args.host, exit_words(code)
                )
                self._kill_workers()
                return 128 - code if code < 0 else code
        if self.phase is AgentPhase.LEAVING:
            for i in ended:
                del self.workers[i]
            return None
        codes = {code for code in ended.values() if code is not None}
        log.info("%s: worker(s) %s ended with %s", self.args.host, sorted(ended), sorted(codes))
        if codes == {JOB_OVER}:
            # The job failed and the controller was told (worker.py): it ends the job. Started again now, they would
            # open a round the peers still judging their own failure take for a lost peer.
            for i in ended:
                del self.workers[i]
            if not self._alive():
                self._move(AgentPhase.RETURNED)
            return None
        if self._alive():
            if codes <= {0}:
                return None  # returned; the others still run (uneven): wait for them
            for i in ended:
                del self.workers[i]
            self._restart(
                "a worker "
                + ("left" if codes & {EXIT_LEFT} else "lost a peer" if EXIT_PEER_LOST in codes else "failed")
            )
            return None
        self.workers.clear()
        if codes <= {0}:
            self._move(AgentPhase.RETURNED)
            return None
        if codes & {EXIT_LEFT} and self.term_at is None:
            self._restart("its workers left without being told")
            return None
        self._restart("its workers " + ("lost a peer" if EXIT_PEER_LOST in codes else "failed"))
        return None

    def _restart(self, why: str) -> None:
        """Start this node's workers again and re-join: provisional where the job re-forms in place (they resume from
        a peer or from the commit this node holds), else into the next round."""
        self.restarts += 1
        if self.restarts > self.args.max_restarts:
            raise WorkerEnded(1)
        self._stop_workers()
        log.info(
            "%s: %s: starting its workers again%s",
            self.args.host,
            why,
            " (they rejoin in place)" if self.in_place else "",
        )
        self._learn_capable()
        if self.in_place:
            self._spawn(provisional=True)
        self._move(AgentPhase.JOINING)  # its join re-forms the same hosts, or joins the controller's newer round

    def _stop_workers(self) -> None:
        """SIGTERM the workers, SIGKILL after the grace (a restart)."""
        alive = [p for p in self.workers.values() if p.is_alive()]
        for p in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.args.stop_grace
        while any(p.is_alive() for p in alive) and time.monotonic() < deadline:
            time.sleep(0.02)
        self._kill_workers()
        self.workers.clear()

    def _kill_workers(self) -> None:
        for p in self.workers.values():
            if p.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
        for p in self.workers.values():
            p.join(5)

    def _alive(self) -> bool:
        return any(p.is_alive() for p in self.workers.values())

    def _status(self, local_rank: int) -> dict:
        try:
            return json.loads(self._inplace.worker_status_path(self.dir, local_rank).read_text())
        except (OSError, ValueError):
            return {}

    def _ready(self, local_rank: int) -> bool:
        """A worker may be given a round: not started provisional, or parked at its first batch."""
        return not self.provisional or bool(self._status(local_rank).get("parked"))

    def _formed(self, local_rank: int) -> bool:
        return int(self._status(local_rank).get("round", -1)) >= self.round

    def _workers_want(self) -> bool:
        """A worker waits for a round after the one it is in (the group agreed to re-form, a collective failed)."""
        return any(self._status(i).get("wants") is not None for i in self.workers)

    def _learn_capable(self) -> None:
        if not self.in_place and any(self._status(i).get("capable") for i in self.workers):
            self.in_place = True
            log.info("%s: the job's ranks reach loader boundaries: they re-form in place from now on", self.args.host)

    def _nudge_time(self) -> float | None:
        try:
            return os.stat(self.dir / self._inplace.NUDGE).st_mtime_ns
        except FileNotFoundError:
            return None

    # ------------------------------------------------------------ the controller's rounds

    def _poll(self, round_number: int) -> dict | None:
        self._polled = time.monotonic()
        try:
            reply = self.client.request(
                RdzvPoll(self.args.job_id, self.args.host, round_number, in_place=self.in_place), timeout_s=10.0
            )
        except (ControllerUnavailable, RequestRefused) as exc:
            log.warning("rdzv.poll: %s (keeping the current round)", exc)
            return None
        if reply.get("in_place") and not self.in_place:
            self.in_place = True
        return reply

    def _join(self) -> dict | None:
        """One ask to join the round after ours (non-blocking: "wait" means ask again)."""
        try:
            return self.client.request(
                RdzvJoin(self.args.job_id, self.args.host, self.round, in_place=self.in_place), timeout_s=10.0
            )
        except (ControllerUnavailable, RequestRefused) as exc:
            log.warning("rdzv.join: %s", exc)
            return None

    def _closed(self, reply: dict) -> None:
        """A round closed for this node: its workers are told (the notice), and this is the agent's round now."""
        self.round, self.round_info = int(reply["round"]), reply
        self.serial += 1
        store = reply["store"]
        self._inplace.Notice(
            self.serial,
            self.round,
            int(reply["rank"]),
            int(reply["world_size"]),
            store["host"],
            int(store["port"]),
            store["prefix"],
        ).write(self.notice_path)
        log.info(
            "%s joined round %d of %s as node %d of %d",
            self.args.host,
            self.round,
            self.args.job_id,
            reply["rank"],
            reply["world_size"],
        )

    def _tell_leave(self) -> None:
        """The workers leave at their next boundary (those SIGTERM did not reach hear it here)."""
        self.serial += 1
        self._inplace.Notice(self.serial, self.round, leave=True).write(self.notice_path)
        self.deadline = time.monotonic() + self.args.stop_grace
        for p in self.workers.values():
            if p.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)

    def _on_term(self, signum, frame) -> None:
        if self.term_at is None:
            self.term_at = time.monotonic()

    def _move(self, to: AgentPhase) -> None:
        if to not in AGENT_MOVES[self.phase]:
            raise RuntimeError(f"in-place agent: {self.phase.value} -> {to.value}")
        self.phase = to


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m pilotfill.elastic.torch.agent", description=__doc__.split("\n\n")[0])
    ap.add_argument("--job-id", required=True)
    ap.add_argument("--host", default=os.environ.get("PILOTFILL_HOST"))
    ap.add_argument("--nproc", type=int, default=1, help="ranks on this node")
    ap.add_argument("--min-nodes", type=int, default=1)
    ap.add_argument("--max-nodes", type=int, default=1 << 20)
    ap.add_argument(
        "--gpus-per-node", type=int, default=None, help="bind ranks to this many GPUs (default: the node's)"
    )
    ap.add_argument("--max-restarts", type=int, default=100, help="worker failures (not membership changes) tolerated")
    ap.add_argument("--monitor-interval", type=float, default=MONITOR_INTERVAL_S)
    ap.add_argument("--poll-interval", type=float, default=0.2, help="seconds between rdzv.poll")
    ap.add_argument(
        "--stop-grace",
        type=float,
        default=STOP_GRACE_S,
        help="seconds between SIGTERM and SIGKILL for workers (the pilot's grace)",
    )
    ap.add_argument(
        "--collective-timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="timeout of the workers' process groups, seconds",
    )
    ap.add_argument(
        "--preload",
        default=None,
        help="the job's module, imported once by the workers' forkserver (default: asked of the controller)",
    )
    ap.add_argument(
        "--resize",
        choices=("in_place", "restart"),
        default="restart",
        help=(
            "in_place: workers outlive membership changes (elastic/torch/inplace.py); "
            "restart: torch elastic's own restarts"
        ),
    )
    args = ap.parse_args(argv)
    if not args.host:
        ap.error("--host (or PILOTFILL_HOST) is required")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.host} %(name)s %(levelname)s %(message)s")
    run_dir = os.environ["PILOTFILL_RUN_DIR"]
    os.environ.update({"PILOTFILL_JOB_ID": args.job_id, "PILOTFILL_HOST": args.host, "PILOTFILL_RUNTIME": "torch"})
    # same nproc on every node: ranks without a store round trip
    os.environ.setdefault("TORCH_ELASTIC_WORKER_IDENTICAL", "1")
    for name, value in worker_environment(args.collective_timeout).items():
        os.environ.setdefault(name, value)  # every worker's (the forkserver's environment); the node's own settings win
    started = time.monotonic()
    # forked from the pilot's zygote (pilotfill.pilots.warm): torch imported, no thread yet
    warm = "torch" in sys.modules
    module = args.preload if args.preload is not None else None if warm else entry_module(run_dir, args.job_id)
    # first: it imports while we do (warm: before any thread starts)
    warming = start_forkserver(module or None, warm=warm)

    from torch.distributed.elastic.multiprocessing.api import SignalException

    def on_signal(signum, frame):
        raise SignalException(f"agent got signal {signum}", sigval=signal.Signals(signum))

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    handler = None
    try:
        if args.resize == "in_place":
            from ...transport import Client

            if warming is not None:
                warming.join()
            log.info(
                "%s: ready after %.1f s (%s)",
                args.host,
                time.monotonic() - started,
                "forked warm" if warm else "workers' forkserver warm",
            )
            return InPlaceAgent(args, run_dir, Client(run_dir, timeout_s=30.0)).run()
        agent, handler = make_agent(args, run_dir)
        if warming is not None:
            warming.join()
        log.info("%s: ready to join after %.1f s (workers' forkserver warm)", args.host, time.monotonic() - started)
        result = agent.run()
    except SignalException as exc:
        log.info("%s: stopping on %s", args.host, exc.sigval.name)
        return 128 + int(exc.sigval)
    except WorkerEnded as exc:
        from ..ending import exit_words

        log.error("%s: a worker %s: leaving (the controller counts such ends)", args.host, exit_words(exc.code))
        return 128 - exc.code if exc.code < 0 else exc.code
    finally:
        if handler is not None:
            handler.shutdown()
    if result is None:  # this host left the job (rendezvous said "ended")
        return 0
    if result.is_failed():
        log.error("%s: workers failed: %s", args.host, result.failures)
        return 1
    return 0

if __name__ == "__main__":
    sys.exit(main())
