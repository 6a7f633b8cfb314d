"""Elastic PyTorch (``torch.distributed.elastic``) behind the runtime interface: ``runtime.kind = "torch"``.

One torch elastic agent per node of a job (:mod:`pilotfill.elastic.torch.agent`),
started and ended on its node through a :class:`~pilotfill.elastic.launch.NodeLauncher`
(the node's pilot agent; :class:`~pilotfill.elastic.launch.LocalLauncher` on the
local cluster and in tests) — this runtime never starts anything on a compute
node itself. Membership is the controller's: every start, resize and stop
updates :attr:`TorchRuntime.rendezvous` (a :class:`RendezvousBook`), which
answers the agents' ``rdzv.join``/``rdzv.poll`` (route them with
:func:`pilotfill.elastic.rendezvous.handle`). A round closes as soon as the
allocated hosts have joined; agents on kept hosts hear of the change from the
controller and hand the new round to their workers, which move to it at their
next step boundary without stopping (``resize="in_place"``, the default:
:mod:`pilotfill.elastic.torch.inplace`); a node that joins takes the job's
state from a peer, and a node that leaves (released, or preempted with a
grace) leaves at a step boundary, so nothing is redone. Code that never reaches
a loader boundary, and ``resize="restart"`` (``PILOTFILL_TORCH_RESIZE=restart``
in the controller's environment: what torch elastic does, kept to compare),
restart every worker on a change, resuming from the last durable commit
(:class:`pilotfill.elastic.state.ElasticState`).

The run's torch store (:mod:`pilotfill.elastic.torch.store`) runs here, on the
controller's machine, started once with the runtime; rank 0's node holds
nothing that the job needs after it leaves, and no pilot agent can end the
store (:func:`store_environment`), even one on the controller's own host.

An agent ending on its own on a host the job still holds is that host lost,
not the job: it is dropped from the job's rendezvous at once (the survivors
re-form without waiting for the controller's next allocation) and reported as
a crashed :class:`RankExit` for that host.

Across a controller restart (where ``pilotfill run`` restarts it) the store
outlives the controller, and each job's current round is written to
``RUN/rendezvous/<job>.json`` whenever it opens, closes or ends: the next
controller's runtime adopts the store and the rounds (:meth:`TorchRuntime.adopt`)
and the agents, polling their round, keep training — no new round unless the
job's hosts must change.

This module imports no torch: the controller does not pay for it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ... import procs
from ...lease import restarted_if_it_dies
from ...protocol import RdzvJoin, RdzvPoll, Reply
from ..base import OnSpawn, RankExit, Runtime
from ..collectives import DEFAULT_TIMEOUT_S
from ..launch import NodeLauncher
from ..rendezvous import RendezvousBook
from ..rendezvous import handle as rendezvous_handle

if TYPE_CHECKING:
    from ...config import Config
from .store import PORT_FILE, read_port_file

STORE_RESTART_BACKOFF_S = 2.0
RESIZE_ENV = "PILOTFILL_TORCH_RESIZE"
"""``restart``: every change restarts the workers (torch elastic's own way, kept to compare); else in place."""
RESIZES = ("in_place", "restart")
ROUNDS_DIR = "rendezvous"
"""Each job's current round, for a restarted controller (written only where one will adopt them)."""


def store_environment(run_dir: Path) -> dict[str, str]:
    """The store's environment: the controller's, with the run directory (so that ``pilotfill run``'s last sweep
    finds it) and nothing that says "a job's process on a node" (``PILOTFILL_JOB_ID``, ``PILOTFILL_HOST``,
    ``HOROVOD_HOSTNAME``, even if the controller was started with them): a pilot agent ends only processes that
    say both, so none can take the store for one of its own — wherever the controller runs (recheck (a): agents
    on the controller's host SIGTERMed the store at every preemption and release). It also runs in a session of its
    own, so no batch system's end-of-job kill of a pilot's session reaches it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PILOTFILL_JOB_ID", "PILOTFILL_HOST", "HOROVOD_HOSTNAME")}
    return {**env, "PILOTFILL_RUN_DIR": str(run_dir), "PILOTFILL_ROLE": "torch-store"}


class TorchRuntime(Runtime):
    """``TorchRuntime(run_dir, launcher, ranks_per_node=1, gpus_per_node=None, store_host="127.0.0.1", grace_s=5.0)``.

    ``ranks_per_node`` (one per GPU on GPU nodes) and ``gpus_per_node`` (None:
    each node's own; 0: no binding) are defaults a job spec may override with
    keys of the same names. ``store_host`` is the address of this machine that
    compute nodes reach (the controller's host name on a cluster).
    ``agent_env`` is added to every agent's environment. ``grace_s``: the pilot's
    grace, what workers get between SIGTERM and SIGKILL; ``collective_timeout_s``:
    the timeout of their process groups (:mod:`pilotfill.elastic.collectives`).
    ``store_lease_s``: the store outlives this runtime's controller, and a store
    such a predecessor left is adopted, ending once the campaign's lease is ended or
    unrenewed this long (None: the store dies with the controller, nothing is adopted).
    ``resize``: ``in_place`` (workers outlive membership changes) or ``restart``
    (torch elastic's restarts); default: ``$PILOTFILL_TORCH_RESIZE``, else in place.
    """

    # its agents' rendezvous (pilotfill.elastic.rendezvous)
    handles: ClassVar[tuple[str, ...]] = (RdzvJoin.TYPE, RdzvPoll.TYPE)

    def resize_restarts_ranks(self, job_id: str | None = None) -> bool:
        # Every resize is a new rendezvous round: the old ranks report at the old size until they are in it (restarted,
        # or re-formed in place at their next step: their first report after says so, and what the change cost).
        return True

    @classmethod
    def from_config(cls, config: Config, run_dir: Path, launcher: NodeLauncher, on_spawn: OnSpawn) -> TorchRuntime:
        rt, bind = config.runtime, config.controller.bind
        store_host = socket.getfqdn() if bind in ("0.0.0.0", "*") else bind  # the address compute nodes reach
        restarted = restarted_if_it_dies(run_dir)  # a successor adopts the store and the rounds: see the module
        return cls(
            run_dir,
            launcher,
            ranks_per_node=rt.ranks_per_node,
            gpus_per_node=rt.gpus_per_node,
            store_host=store_host,
            grace_s=config.pilots.grace_s,
            collective_timeout_s=rt.collective_timeout_s,
            on_spawn=on_spawn,
            store_lease_s=config.pilots.heartbeat_deadline_s if restarted else None,
        )

    def handle(self, message: Any, now: float) -> Reply:
        """A torch elastic agent joining its job's round, or asking whether membership changed: the book's answer as
        the message's reply class (``RdzvJoinReply``, ``RdzvPollReply``; a key the class lacks is an error, not
        dropped)."""
        reply = rendezvous_handle(self.rendezvous, message.to_dict(), now)
        reply.pop("ok", None)
        self._save_rounds()  # a join may close a round, or re-form one
        return message.REPLY(**reply)

    def __init__(
        self,
        run_dir: Path | str,
        launcher: NodeLauncher,
        ranks_per_node: int = 1,
        gpus_per_node: int | None = None,
        store_host: str = "127.0.0.1",
        python: str = sys.executable,
        agent_env: dict[str, str] | None = None,
        poll_interval_s: float = 0.2,
        clock: Callable[[], float] = time.time,
        grace_s: float = 5.0,
        collective_timeout_s: float = DEFAULT_TIMEOUT_S,
        on_spawn: OnSpawn | None = None,
        store_lease_s: float | None = None,
        resize: str | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.resize_mode = resize or os.environ.get(RESIZE_ENV) or "in_place"
        if self.resize_mode not in RESIZES:
            raise ValueError(
                f"torch runtime: resize must be one of {', '.join(RESIZES)}, got {self.resize_mode!r} (${RESIZE_ENV})"
            )
        self.launcher = launcher
        self.ranks_per_node = ranks_per_node
        self.gpus_per_node = gpus_per_node
        self.store_host = store_host
        self.python = python
        self.agent_env = dict(agent_env or {})
        self.poll_interval_s = poll_interval_s
        self.grace_s = grace_s
        self.collective_timeout_s = collective_timeout_s
        self._clock = clock
        self.rendezvous = RendezvousBook()
        self._hosts: dict[str, list[str]] = {}
        self._specs: dict[str, dict[str, Any]] = {}
        self._on_spawn: OnSpawn = on_spawn or (lambda process, what, job, host: None)
        self.store_lease_s = store_lease_s
        self._store: Any = None  # the store's Popen, or procs.Adopted: a predecessor's
        self._store_started = 0.0
        self._rounds = self.run_dir / ROUNDS_DIR
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        from ...pilots.warm import want

        want(self.run_dir)  # this run's pilots keep torch warm on their nodes, for the agents placed there
        if store_lease_s is None or not self._adopt_store():
            self._start_store()

    # ------------------------------------------------------------ Runtime

    def start(self, job_id: str, spec: dict[str, Any], hosts: list[str]) -> None:
        if job_id in self._hosts:
            self.stop(job_id)
        self._specs[job_id] = dict(spec)
        self._hosts[job_id] = []
        self.resize(job_id, hosts)

    def resize(self, job_id: str, hosts: list[str], lost: Iterable[str] = ()) -> None:
        """Grow or shrink to exactly ``hosts``; ``lost``: hosts that went away on their own (their agents are ended
        too).

        A job that is not running (never started, or stopped) is left alone.
        """
        if job_id not in self._specs:
            return
        hosts = list(dict.fromkeys(hosts))
        before = self._hosts.get(job_id, [])
        self._hosts[job_id] = hosts
        self._check_store()
        self.rendezvous.expect(job_id, hosts, self._clock())
        for host in dict.fromkeys([*before, *lost]):
            if host not in hosts:
                self.launcher.terminate(host, job_id)
        self._save_rounds()
        for host in hosts:
            if host not in before:
                self.launcher.launch(host, job_id, self.agent_argv(job_id, host), self.agent_environment(job_id))

    def adopt(self, job_id: str, spec: dict[str, Any], hosts: list[str]) -> bool:
        """A predecessor's job whose agents run on ``hosts``: its round as that controller left it (``rendezvous/``)
        and the store it adopted, so the agents polling their round keep training. Where the journal's hosts differ
        from the round's (the predecessor died between the two), a new round opens for them. False: nothing to adopt
        (the store is new, or the job's round was never written)."""
        if self.store_lease_s is None or not isinstance(self._store, procs.Adopted):
            return False  # a new store has none of the round's keys: its ranks would fail at their next use of them
        try:
            saved = json.loads((self._rounds / f"{job_id}.json").read_text())
            self.rendezvous.restore(job_id, saved)
        except (OSError, ValueError, KeyError, TypeError):
            return False
        self._specs[job_id] = dict(spec)
        self._hosts[job_id] = list(dict.fromkeys(hosts))
        self.rendezvous.expect(job_id, self._hosts[job_id], self._clock())
        self._save_rounds()
        return True

    def resize_keeps_progress(self, grow_only: bool, job_id: str | None = None) -> bool:
        # In place, the survivors keep every step (a hard loss sends them back to the commit, and rank 0's next report
        # of its loader's position counts what they do again); restarted workers resume from the commit.
        return job_id is not None and self.rendezvous.in_place(job_id)

    def stop(self, job_id: str) -> None:
        hosts = self._hosts.pop(job_id, [])
        self._specs.pop(job_id, None)
        self.rendezvous.forget(job_id)
        self._save_rounds()
        for host in hosts:
            self.launcher.terminate(host, job_id)

    def hosts(self, job_id: str) -> list[str]:
        return list(self._hosts.get(job_id, []))

    def poll(self) -> list[RankExit]:
        self._check_store()
        out: list[RankExit] = []
        for ended in self.launcher.exits():
            held = self._hosts.get(ended.job_id, [])
            if ended.requested or ended.host not in held:
                out.append(RankExit(ended.job_id, ended.host, ended.returncode, requested=True))
                continue
            # The agent ended on its own on a host the job holds: the host is lost, the job goes on.
            self._hosts[ended.job_id] = [h for h in held if h != ended.host]
            self.rendezvous.expect(ended.job_id, self._hosts[ended.job_id], self._clock())
            out.append(RankExit(ended.job_id, ended.host, ended.returncode, requested=False))
        self._save_rounds()
        return out

    def close(self, wait_s: float = 10.0) -> None:
        pending = {(h, j) for j, hs in self._hosts.items() for h in hs}
        for job_id in list(self._hosts):
            self.stop(job_id)
        deadline = time.monotonic() + wait_s
        while pending and time.monotonic() < deadline:
            pending -= {(e.host, e.job_id) for e in self.launcher.exits()}
            time.sleep(0.05)
        if self._store is not None:
            procs.kill_group(self._store.pid, getattr(self._store, "ticks", None), grace_s=2.0)
            self._store.wait()
            self._store = None
        (self.run_dir / PORT_FILE).unlink(missing_ok=True)
        shutil.rmtree(self._rounds, ignore_errors=True)  # nothing runs that a successor could adopt

    # ------------------------------------------------------------ agents

    def agent_argv(self, job_id: str, host: str) -> list[str]:
        spec = self._specs[job_id]
        argv = [
            self.python, "-m", "pilotfill.elastic.torch.agent", "--job-id", job_id, "--host", host,
            "--nproc", str(int(spec.get("ranks_per_node") or self.ranks_per_node)),
            "--min-nodes", str(spec.get("min_nodes", 1)), "--max-nodes", str(spec.get("max_nodes", 1 << 20)),
            "--poll-interval", str(self.poll_interval_s), "--stop-grace", str(self.grace_s),
            "--collective-timeout", str(self.collective_timeout_s), "--resize", self.resize_mode,
        ]  # fmt: skip
        gpus = spec.get("gpus_per_node", self.gpus_per_node)
        if gpus is not None:
            argv += ["--gpus-per-node", str(int(gpus))]
        module = str(spec.get("entry") or "").partition(":")[0]
        argv += ["--preload", module]  # named here: an agent forked warm asks nothing before its forkserver is forked
        return argv

    def agent_environment(self, job_id: str) -> dict[str, str]:
        return {
            **self.agent_env,
            "PILOTFILL_RUN_DIR": str(self.run_dir),
            "PILOTFILL_JOB_ID": job_id,
            "PILOTFILL_RUNTIME": "torch",
            "PYTHONUNBUFFERED": "1",
        }

    # ------------------------------------------------------------ the store

    def _start_store(self) -> None:
        (self.run_dir / PORT_FILE).unlink(missing_ok=True)
        self.rendezvous.store = None
        log = self.run_dir / "logs" / "torch_store.log"
        argv = [
            self.python,
            "-m",
            "pilotfill.elastic.torch.store",
            "--run-dir",
            str(self.run_dir),
            "--host",
            self.store_host,
        ]
        if self.store_lease_s is not None:
            argv += ["--lease-deadline", str(self.store_lease_s)]
        self._store = procs.spawn(
            argv, env=store_environment(self.run_dir), log_path=str(log), outlive_parent=self.store_lease_s is not None
        )
        self._store_started = time.monotonic()
        self._on_spawn(self._store, "store", None, self.store_host)

    def _adopt_store(self) -> bool:
        """Take over the store a predecessor controller left running (its port file names it by pid and start time)."""
        info = read_port_file(self.run_dir)
        if info is None or not isinstance(info.get("pid"), int) or not isinstance(info.get("ticks"), int):
            return False
        store = procs.Adopted(info["pid"], info["ticks"])
        if store.poll() is not None:
            return False
        self._store, self._store_started = store, time.monotonic()
        self.rendezvous.set_store(info["host"], info["port"])
        # this controller's now: not killed as a predecessor's leftover
        self._on_spawn(store, "store", None, info["host"])
        return True

    def _save_rounds(self) -> None:
        """Write the rounds that opened, closed or ended, for a successor (only where one will adopt them)."""
        changed = self.rendezvous.take_changed()
        if self.store_lease_s is None:
            return
        for job_id in changed:
            path = self._rounds / f"{job_id}.json"
            saved = self.rendezvous.saved(job_id)
            try:
                if saved is None:
                    path.unlink(missing_ok=True)
                    continue
                self._rounds.mkdir(mode=0o700, exist_ok=True)
                tmp = path.with_name(f".{path.name}.tmp")
                # the prefix opens the round's keys: private
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps(saved))
                os.replace(tmp, path)
            except OSError:
                pass  # a full disk: the journal says so; a successor then requeues the job from its commit

    def _check_store(self) -> None:
        """Learn the store's port once it listens; restart it if it died (new rounds then use the new one)."""
        if self._store is None:
            return
        if self._store.poll() is not None:
            if time.monotonic() - self._store_started >= STORE_RESTART_BACKOFF_S:
                self._start_store()
            return
        if self.rendezvous.store is None:
            info = read_port_file(self.run_dir)
            if info is not None and info.get("pid") == self._store.pid:
                self.rendezvous.set_store(info["host"], info["port"])

    def wait_for_store(self, timeout_s: float = 60.0) -> tuple[str, int]:
        """Block until the store listens (tests and benchmarks; the controller just polls)."""
        deadline = time.monotonic() + timeout_s
        while self.rendezvous.store is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the torch store did not start; see {self.run_dir / 'logs' / 'torch_store.log'}")
            time.sleep(0.05)
            self._check_store()
        return self.rendezvous.store
