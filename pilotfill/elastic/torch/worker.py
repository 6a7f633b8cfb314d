"""One rank under the torch runtime: :mod:`pilotfill.elastic.rank`, adapted to torch elastic.

The elastic agent (:mod:`pilotfill.elastic.torch.agent`) starts it — forked
from a warm forkserver as a function (:func:`entry`), or as
``python -m pilotfill.elastic.torch.worker``. It fetches the job and runs its
function like ``rank`` does, with three differences:

* the round's store namespace: a plain ``dist.init_process_group()``
  (``env://``) uses the run's store at ``MASTER_ADDR:MASTER_PORT`` — an
  authenticated store only the run's processes can use (:mod:`.store`),
  not a ``TCPStore`` — under the round's prefix (``PILOTFILL_RDZV_PREFIX``), so
  it never sees another round's or another job's keys;
* when the job's function raises, what happened is judged by what happened
  to the peers, never by the exception's text (a user's own
  ``RuntimeError("…: Connection refused")`` reads exactly like gloo's): the
  rank says so in the round's store and watches (:class:`Peers`). The
  controller saying the round changed — a host left, or a peer's agent came
  back because its workers died — is a lost peer: the rank exits with
  :data:`EXIT_PEER_LOST` and its agent re-forms. Every rank of the round
  having failed, each there to say so, is the user's error: reported once,
  with the first failure's traceback. Neither within
  :data:`PEER_EVIDENCE_S`: the peers are alive and waiting for this rank —
  its own error, reported. Re-forms that fail the same way (the same
  exception at the same line of the user's code) with nothing committed in
  between end the job after :data:`SAME_FAILURES`;
* only global rank 0 sends ``job.result`` (every rank returns a value);
* every process group it creates without a timeout gets the run's collective
  timeout (:mod:`pilotfill.elastic.collectives`), and Horovod is refused
  (:mod:`pilotfill.elastic.guard`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

from ...procs import die_with_parent
from ...protocol import JobFailed, JobGet, JobResult, JobStatusQuery, RdzvPoll
from ...transport import Client, ControllerUnavailable, RequestRefused
from ..collectives import configure_process_groups
from ..ending import exited_text
from . import inplace
from ..guard import refuse_horovod
from ..rank import resolve, run_parsl_task

EXIT_PEER_LOST = 75
"""Exit status of a rank whose collective failed because another rank is gone (EX_TEMPFAIL)."""

PEER_EVIDENCE_S = float(os.environ.get("PILOTFILL_PEER_EVIDENCE_S", "30"))
"""How long a failed rank waits for its peers' or the controller's word before taking the failure for its own
(the controller hears of a lost node within a heartbeat deadline: 5 s by default)."""
SAME_FAILURES = 3
"""Re-forms in a row that fail the same way, with nothing committed in between, before the job is failed."""
POLL_S = 0.5


class Peers:
    """What happened to the other ranks of this rank's round: asked of the round's store and of the controller.

    ``judge(exc)`` returns the exit status to leave with — :data:`EXIT_PEER_LOST` (re-form), 1 (another rank
    reports the failure, or the job is over) — or None: this rank reports ``exc`` as the job's failure.
    """

    def __init__(
        self, client: Client, job_id: str, env: dict[str, str] | None = None, evidence_s: float = PEER_EVIDENCE_S
    ):
        self.client, self.job_id, self.evidence_s = client, job_id, evidence_s
        self._env = env
        self._read()

    def _read(self) -> None:
        """This rank's round as it is now (an in-place re-form changes it under the job's function)."""
        env = dict(os.environ if self._env is None else self._env)
        self.rank, self.world = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
        self.round, self.host = int(env.get("PILOTFILL_RDZV_ROUND", "-1")), env.get("PILOTFILL_HOST", "")
        self.prefix = env.get("PILOTFILL_RDZV_PREFIX", "")
        self.where = (env.get("PILOTFILL_RUN_DIR", ""), env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", ""))

    def judge(self, exc: BaseException) -> int | None:
        self._read()
        if self.world <= 1 or not self.prefix:
            return None  # nobody to lose: the user's own error
        # The agent SIGTERMs its workers the moment it hears the round changed (often while this one watches): the
        # judgment is finished first — a poll and a count, well within the agent's grace — then the rank goes.
        told = threading.Event()
        if threading.current_thread() is not threading.main_thread():  # signals are the main thread's alone
            return self._judge(exc, told)
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: told.set())
        try:
            return self._judge(exc, told)
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _judge(self, exc: BaseException, told: threading.Event) -> int | None:
        failures = self._say(exc)
        release_peers()
        deadline, polled = time.monotonic() + self.evidence_s, 0.0
        while time.monotonic() < deadline:
            if failures is not None and not told.is_set() and self._count(failures) >= self.world:
                return self._first_reports(failures)  # every rank failed, each there to say so: the user's error
            if failures is not None and not told.is_set() and self._count(failures, "returned") > 0:
                # A peer's function returned (it ran fewer steps than this rank): re-form from the last commit,
                # counted as a failure of the same hosts (nothing committed between such re-forms ends the job).
                return self._lost_peer(exc, same_hosts=True, returned=self._count(failures, "returned"))
            if told.is_set() or time.monotonic() - polled >= POLL_S:
                polled = time.monotonic()
                reply = self._poll()
                if reply is not None and not reply.get("current"):
                    return 1  # the job is over
                if reply is not None and (reply.get("waiting") or reply.get("current") != self.round):
                    return self._lost_peer(exc, bool(reply.get("same_hosts")))
                if told.is_set():
                    return EXIT_PEER_LOST  # stopped by the agent (a release, a preemption): nothing to judge
            told.wait(0.1)
        return self._first_reports(failures) if failures is not None else None

    def returned(self) -> None:
        """This rank's function returned while the job goes on (rank 0's result is the job's): said in the round's
        store, so that a peer whose collective now fails — it ran more steps than this rank did — re-forms the round
        from the last commit at once instead of taking the failure for its own (turn 4 (a))."""
        self._read()
        if self.world <= 1 or not self.prefix:
            return
        print(
            f"pilotfill: rank {self.rank} returned while the job goes on; rank 0's result ends it",
            file=sys.stderr,
            flush=True,
        )
        try:
            self._store(f"{self.prefix}/pilotfill-failures").add("returned", 1)
        except Exception as err:  # noqa: BLE001 - no store: the peers wait for the controller's word instead
            print(f"pilotfill: rank {self.rank} cannot reach the run's store ({err})", file=sys.stderr, flush=True)

    # ------------------------------------------------------------ the round's store

    def _store(self, prefix: str):
        from torch.distributed import PrefixStore

        from ..run_store import RunStore

        run_dir, host, port = self.where
        return PrefixStore(prefix, RunStore(run_dir, host, int(port), timeout=timedelta(seconds=10)))

    def _say(self, exc: BaseException):
        """Record this rank's failure in the round's store; the store (prefixed), or None when it cannot be reached."""
        try:
            store = self._store(f"{self.prefix}/pilotfill-failures")
            store.set(f"rank/{self.rank}", json.dumps({"time": time.time(), "rank": self.rank, "what": signature(exc)}))
            store.add("count", 1)
            return store
        except Exception as err:  # noqa: BLE001 - no store: the controller's word alone decides
            print(f"pilotfill: rank {self.rank} cannot reach the run's store ({err})", file=sys.stderr, flush=True)
            return None

    @staticmethod
    def _count(store, key: str = "count") -> int:
        try:
            return int(store.add(key, 0))
        except Exception:  # noqa: BLE001
            return 0

    def _first_reports(self, store) -> int | None:
        """None if this rank failed first (it reports), else 1 (the first one does)."""
        first = (time.time(), self.rank)
        for r in range(self.world):
            try:
                if store.check([f"rank/{r}"]):
                    said = json.loads(store.get(f"rank/{r}"))
                    first = min(first, (float(said["time"]), int(said["rank"])))
            except Exception:  # noqa: BLE001
                continue
        return None if first[1] == self.rank else 1

    # ------------------------------------------------------------ the controller

    def _poll(self) -> dict[str, Any] | None:
        try:
            return self.client.request(RdzvPoll(self.job_id, self.host, self.round), timeout_s=10)
        except (ControllerUnavailable, RequestRefused):
            return None

    def _lost_peer(self, exc: BaseException, same_hosts: bool, returned: int = 0) -> int:
        """A peer is gone. The controller's own change of hosts re-forms freely; a re-form of the same hosts (a peer's
        process failed, or ``returned`` peers' functions returned early) that fails the same way as the last, with
        nothing committed since, is counted."""
        if returned:
            print(
                f"pilotfill: rank {self.rank}'s collective failed after {returned} peer(s) returned "
                f"({type(exc).__name__}); re-forming from the last commit",
                file=sys.stderr,
                flush=True,
            )
        else:
            print(
                f"pilotfill: rank {self.rank} lost a peer ({type(exc).__name__}: {str(exc)[:200]}); re-forming",
                file=sys.stderr,
                flush=True,
            )
        if not same_hosts:
            return EXIT_PEER_LOST
        count = self._count_same_failure(signature(exc))
        if count < SAME_FAILURES:
            return EXIT_PEER_LOST
        if returned:
            why = (
                f"each time {returned} of its {self.world} ranks returned from the function while rank {self.rank} was "
                "still in a collective: "
                "the ranks ran different numbers of steps (uneven inputs: give every rank the same number of batches, "
                "e.g. drop the last partial one, or use torch.distributed.algorithms.Join)"
            )
        else:
            why = f"a rank's process ended each time (see the job's logs under {self.where[0]}/logs)"
        # The explanation last: it is the line the campaign's terminal shows.
        error = (
            f"the last failure seen by rank {self.rank}:\n"
            + "".join(traceback.format_exception(exc))
            + f"the job re-formed {count} times in a row failing the same way ({signature(exc)}) "
            f"with nothing committed in between: {why}"
        )
        with contextlib.suppress(ControllerUnavailable, RequestRefused):
            self.client.request(JobFailed(self.job_id, error))
        return 1

    def _count_same_failure(self, what: str) -> int:
        """Failure re-forms in a row of the job that failed as ``what`` with the same committed progress, this round's
        included (counted once per round, whichever rank gets there first)."""
        try:
            status = self.client.request(JobStatusQuery([self.job_id]), timeout_s=10)["jobs"].get(self.job_id, {})
            store = self._store(f"pilotfill/jobs/{self.job_id}")
        except Exception:  # noqa: BLE001 - cannot count: re-form (torch's max_restarts still bounds it)
            return 0
        committed = status.get("committed")
        for _ in range(8):
            try:
                old = store.get("failures") if store.check(["failures"]) else b""
                record = json.loads(old) if old else {}
                if record.get("round") == self.round:
                    return int(record["count"])
                same = record.get("what") == what and record.get("committed") == committed
                new = json.dumps(
                    {
                        "round": self.round,
                        "what": what,
                        "committed": committed,
                        "count": record.get("count", 0) + 1 if same else 1,
                    }
                )
                if store.compare_set("failures", old, new.encode()) == new.encode():
                    return int(json.loads(new)["count"])
            except Exception:  # noqa: BLE001
                return 0
        return 0


def signature(exc: BaseException) -> str:
    """How ``exc`` failed, without its text: its type and the innermost line of the user's own code it came through."""
    import traceback as tb

    frames = [f for f in tb.extract_tb(exc.__traceback__) if _users(f.filename)]
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}{where}"


def _users(filename: str) -> bool:
    path = str(Path(filename).resolve()) if not filename.startswith("<") else filename
    return not (
        filename.startswith("<") or "site-packages" in path or path.startswith(_PILOTFILL) or path.startswith(_STDLIB)
    )


_PILOTFILL = str(Path(__file__).resolve().parent.parent)
_STDLIB = str(Path(os.__file__).resolve().parent)


def release_peers() -> None:
    """Tear down this rank's process group (on a thread: it may hang on a broken peer), so that peers blocked in a
    collective on this rank fail now and say so, instead of waiting out gloo's timeout."""
    try:
        import torch.distributed as dist

        if not dist.is_initialized():
            return
    except Exception:  # noqa: BLE001
        return
    threading.Thread(target=_destroy, name="pilotfill-release-peers", daemon=True).start()


def _destroy() -> None:
    import torch.distributed as dist

    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - a broken group: its sockets go with the process anyway
        pass


def bind_store(prefix: str | None = None) -> None:
    """Make ``env://`` rendezvous (plain ``init_process_group``) use the run's store under the round's prefix.

    The store is :class:`~pilotfill.elastic.run_store.RunStore` at ``MASTER_ADDR:MASTER_PORT`` (the run's store,
    which only holders of the run's secret can use), not a ``TCPStore`` client: torch's own ``env://`` handler is
    replaced, for this process, by one that reads the same variables and query (rank, world_size)."""
    prefix = prefix or os.environ.get("PILOTFILL_RDZV_PREFIX")
    if not prefix:
        return
    import importlib
    from datetime import timedelta
    from urllib.parse import parse_qs, urlparse

    from torch.distributed import PrefixStore

    from ..run_store import RunStore

    # the module; torch.distributed.rendezvous is also a function
    rdzv = importlib.import_module("torch.distributed.rendezvous")
    # torch's scheme -> handler table (register_rendezvous_handler refuses to replace)
    handlers = rdzv._rendezvous_handlers
    if getattr(handlers["env"], "pilotfill_prefix", None) == prefix:
        return

    def env_handler(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: Any):
        query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
        rank = int(query.get("rank", os.environ.get("RANK", "0")))
        world_size = int(query.get("world_size", os.environ.get("WORLD_SIZE", "1")))
        store = RunStore(
            os.environ["PILOTFILL_RUN_DIR"], os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout=timeout
        )
        yield PrefixStore(prefix, store), rank, world_size
        raise RuntimeError("env:// cannot re-rendezvous; pilotfill restarts the workers instead")

    env_handler.pilotfill_prefix = prefix  # type: ignore[attr-defined]
    handlers["env"] = env_handler


def global_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def main() -> int:
    die_with_parent()
    refuse_horovod("torch")  # before the app's code: hvd.init() here would be a world of one per rank
    configure_process_groups()  # a peer that leaves cannot hang a collective for torch's 10-30 min
    inplace.install()  # its agent says whether this worker outlives membership changes (inplace.py)
    bind_store()
    run_dir, job_id = os.environ["PILOTFILL_RUN_DIR"], os.environ["PILOTFILL_JOB_ID"]
    client = Client(run_dir, timeout_s=60)
    reply = client.request(JobGet(job_id))
    spec = reply["job"]["spec"]
    if reply.get("checkpoint"):
        os.environ["PILOTFILL_CHECKPOINT"] = reply["checkpoint"]  # where this training's commits go (as in rank.py)
    peers = Peers(client, job_id)
    if spec.get("payload"):
        code = run_parsl_task(
            client, job_id, spec["payload"], sends_result=lambda: global_rank() == 0, transient=peers.judge
        )
    else:
        try:
            value = resolve(spec["entry"])(*spec["args"], **spec["kwargs"])
        except Exception as exc:
            code = peers.judge(exc)
            if code is not None:
                return code
            client.request(JobFailed(job_id, traceback.format_exc()))
            return 1
        except BaseException as exc:  # sys.exit(), KeyboardInterrupt raised by the app: its end, said once
            client.request(JobFailed(job_id, exited_text(exc)))
            return 1
        if global_rank() == 0:
            client.request(JobResult(job_id, value))
        code = 0
    if code == 0 and global_rank() != 0:
        peers.returned()
    return code


def entry() -> None:
    """The agent's function entrypoint: a non-zero status must end the process, not be a return value."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    if code == EXIT_PEER_LOST:
        os._exit(code)  # at once: tearing down a broken process group can take seconds, and nothing is left to save
    if code:
        raise SystemExit(code)


def entry_in_place(env: dict[str, str]) -> None:
    """What the in-place agent forks (:mod:`pilotfill.elastic.torch.agent`): this worker's environment, then
    :func:`entry`. Its status is its exit code (the agent reads ``Process.exitcode``)."""
    os.environ.update(env)
    import logging

    said = logging.getLogger("pilotfill.inplace")  # what a re-form did, in the node's log beside its agent's lines
    if not said.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter(
                f"%(asctime)s {os.environ.get('PILOTFILL_HOST', '?')} worker {env.get('LOCAL_RANK', '?')} %(message)s"
            )
        )
        said.addHandler(handler)
        said.setLevel(logging.INFO)
        said.propagate = False
    try:
        entry()
    except SystemExit as done:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(done.code if isinstance(done.code, int) else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    inplace.returned()  # its agent tells this from an app's own os._exit(0), which is the app's end
    os._exit(0)  # no interpreter teardown: a gloo group's destructor can wait on peers that are gone


if __name__ == "__main__":
    sys.exit(main())
