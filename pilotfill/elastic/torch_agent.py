"""One torch elastic agent per node of a job, started on its node by that node's pilot agent.

    PILOTFILL_RUN_DIR=RUN python -m pilotfill.elastic.torch_agent --job-id J --host H --nproc N
        [--min-nodes A --max-nodes B] [--gpus-per-node G] [--stop-grace S] [--collective-timeout T]

torch's ``LocalElasticAgent`` with the ``pilotfill`` rendezvous backend
(:mod:`pilotfill.elastic.torch_rdzv`) and N workers running
:func:`pilotfill.elastic.torch_worker.entry`. Each worker gets torchrun's
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT (the run's
store on the controller's machine) and TORCHELASTIC_*, plus PILOTFILL_RUN_DIR,
PILOTFILL_JOB_ID, PILOTFILL_HOST, PILOTFILL_RUNTIME=torch, the round's store
prefix and, on a node with GPUs, its own device: CUDA_VISIBLE_DEVICES is one
GPU of the node's (by local rank), so every rank uses ``cuda:0``. Every worker
also gets the NCCL error handling and collective timeout of
:mod:`pilotfill.elastic.collectives`.

What makes a restart fast (torchrun took ~12.5 s to respawn workers here):

* workers are forked from a forkserver that has already imported torch,
  ``torch._dynamo`` (the first optimizer's hidden import), pilotfill and the
  job's own module (:mod:`pilotfill.elastic.torch_preload`), so a new worker
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
import importlib.util
import logging
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from multiprocessing import forkserver
from pathlib import Path

from ..procs import die_with_parent
from .collectives import DEFAULT_TIMEOUT_S, worker_environment

log = logging.getLogger("pilotfill.torch_agent")

STOP_GRACE_S = 5.0
"""Workers get this long after SIGTERM before SIGKILL, on restarts and on the agent's own end, unless told the pilot's
grace (``--stop-grace``, which the torch runtime always passes)."""
MONITOR_INTERVAL_S = 0.1
REPORTED_CODES = (1, 75)
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
    from ..transport import Client

    try:
        spec = Client(run_dir, timeout_s=10).request({"type": "job.get", "job_id": job_id})["job"]["spec"]
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


def start_forkserver(job_module: str | None) -> threading.Thread:
    """Start the forkserver importing torch and the job's module once; the thread ends when it is warm.

    The agent joins the rendezvous only after that: joining makes the other
    nodes restart their workers, which would otherwise wait for ours to import.
    Meanwhile the agent imports torch itself (the two overlap).
    """
    if job_module:
        os.environ["PILOTFILL_PRELOAD_MODULE"] = job_module
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["pilotfill.elastic.torch_preload"])
    # Started from this (the main) thread: the forkserver dies with its parent thread (torch_preload sets
    # PR_SET_PDEATHSIG), and the warming thread below ends at once. Its workers die with it in turn.
    forkserver.ensure_running()

    def warm() -> None:
        probe = ctx.Process(target=_noop)
        probe.start()  # returns once the forkserver has preloaded and forked
        probe.join()

    thread = threading.Thread(target=warm, name="forkserver-warm", daemon=True)
    thread.start()
    return thread


def make_agent(args: argparse.Namespace, run_dir: str):
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    from . import torch_rdzv, torch_worker

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
            # which gives up after 60 s and takes the node out of the job (turn 4 (a): 60 s at 0 samples/s, a node lost).
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
                    if code is not None and ((code < 0 and -code not in (signal.SIGTERM, signal.SIGINT)) or code not in REPORTED_CODES and code > 0):
                        raise WorkerEnded(code)
            return result

        def _stop_workers(self, worker_group) -> None:  # a restart; torch's waits up to 30 s for workers to go
            self._shutdown(timeout=grace, restart=True)

        def _shutdown(self, *args, restart: bool = False, **kwargs) -> None:
            if not restart:  # the agent's own end: a second SIGTERM (the pilot agent's, the batch system's) must not cut the grace
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    signal.signal(sig, signal.SIG_IGN)  # torch's handler would raise out of the wait for the workers
            super()._shutdown(*args, **kwargs)

    for hook in ("_set_local_rank_env", "_stop_workers", "_shutdown", "_invoke_run", "_exit_barrier", "_monitor_workers"):
        if not hasattr(LocalElasticAgent, hook):
            raise RuntimeError(f"this torch's LocalElasticAgent has no {hook}: pilotfill's agent is written for torch 2.13")
    params = RendezvousParameters(
        backend=torch_rdzv.BACKEND, endpoint=run_dir, run_id=args.job_id, min_nodes=args.min_nodes, max_nodes=args.max_nodes,
        host=args.host, poll_interval=args.poll_interval,
    )  # fmt: skip
    handler = get_rendezvous_handler(params)
    spec = WorkerSpec(
        role="trainer", local_world_size=args.nproc, rdzv_handler=handler, entrypoint=torch_worker.entry, args=(),
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


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m pilotfill.elastic.torch_agent", description=__doc__.split("\n\n")[0])
    ap.add_argument("--job-id", required=True)
    ap.add_argument("--host", default=os.environ.get("PILOTFILL_HOST"))
    ap.add_argument("--nproc", type=int, default=1, help="ranks on this node")
    ap.add_argument("--min-nodes", type=int, default=1)
    ap.add_argument("--max-nodes", type=int, default=1 << 20)
    ap.add_argument("--gpus-per-node", type=int, default=None, help="bind ranks to this many GPUs (default: the node's)")
    ap.add_argument("--max-restarts", type=int, default=100, help="worker failures (not membership changes) tolerated")
    ap.add_argument("--monitor-interval", type=float, default=MONITOR_INTERVAL_S)
    ap.add_argument("--poll-interval", type=float, default=0.2, help="seconds between rdzv.poll")
    ap.add_argument("--stop-grace", type=float, default=STOP_GRACE_S, help="seconds between SIGTERM and SIGKILL for workers (the pilot's grace)")
    ap.add_argument("--collective-timeout", type=float, default=DEFAULT_TIMEOUT_S, help="timeout of the workers' process groups, seconds")
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
    os.environ.setdefault("TORCH_ELASTIC_WORKER_IDENTICAL", "1")  # same nproc on every node: ranks without a store round trip
    for name, value in worker_environment(args.collective_timeout).items():
        os.environ.setdefault(name, value)  # every worker's (the forkserver's environment); the node's own settings win
    started = time.monotonic()
    warming = start_forkserver(entry_module(run_dir, args.job_id))  # first: it imports while we do

    from torch.distributed.elastic.multiprocessing.api import SignalException

    def on_signal(signum, frame):
        raise SignalException(f"agent got signal {signum}", sigval=signal.Signals(signum))

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    handler = None
    try:
        agent, handler = make_agent(args, run_dir)
        warming.join()
        log.info("%s: ready to join after %.1f s (workers' forkserver warm)", args.host, time.monotonic() - started)
        result = agent.run()
    except SignalException as exc:
        log.info("%s: stopping on %s", args.host, exc.sigval.name)
        return 128 + int(exc.sigval)
    except WorkerEnded as exc:
        from .ending import exit_words

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
