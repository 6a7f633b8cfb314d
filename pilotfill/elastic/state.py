"""Durable elastic state for plain ``torch.distributed`` (the torch runtime).

Under the torch runtime a worker outlives its job's membership changes
(:mod:`pilotfill.elastic.torch.inplace`): the state it holds is the job's, and
a node that joins takes it from a peer at its first batch. What must survive
more than that is what was committed: ``commit()`` has rank 0 write
``checkpoints/<job>.pt`` in the run directory atomically (write, fsync,
rename), and each node's local rank 0 keep a copy in memory (``/dev/shm``),
which a worker restarted after a hard loss (a peer killed, a collective that
failed) resumes from. :class:`ElasticState` restores the durable commit where
nobody holds the job's state — the job started again on new ranks: rank 0
reads it and broadcasts it, so every rank starts from the same state even
where only rank 0 sees the file. The file has the format of
:class:`pilotfill.elastic.horovod_state.TorchState` (Horovod's), so the two
runtimes resume each other's commits.

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from pilotfill.elastic import ElasticLoader, ElasticState

    dist.init_process_group("gloo")                  # env:// — the runtime set it all up
    loader = ElasticLoader(dataset, global_batch=256, seed=0)
    state = ElasticState(model, optimizer, loader=loader)   # the last commit (the loader's position too), or these
    ddp = DistributedDataParallel(model)
    while loader.epoch < EPOCHS:
        for batch in loader:                          # one global batch per step, whatever the world size
            optimizer.zero_grad()
            batch.backward(lambda x, y: F.cross_entropy(ddp(x), y), ddp)
            optimizer.step()
            if batch.step % 10 == 9:
                state.commit()
        state.commit()

A named value with ``state_dict``/``load_state_dict`` (the loader, a learning
rate scheduler) is committed as its ``state_dict`` and restored in place.

Outside pilotfill (no ``PILOTFILL_RUN_DIR``/``PILOTFILL_JOB_ID``) and without
``path=``, commits are kept nowhere and nothing is restored.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..checkpoints import checkpoint_path
from ..report import committed
from .torch import inplace


def stateful(value: Any) -> bool:
    """Whether a named value is restored in place from its ``state_dict``
    (a loader, a scheduler) rather than replaced."""
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if _distributed() else int(os.environ.get("RANK", "0"))


def device() -> torch.device:
    """This rank's device: its GPU (the runtime made it ``cuda:0`` via CUDA_VISIBLE_DEVICES) or the CPU."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


class ElasticState:
    """A model, an optimizer and named values (``loader=loader``, ``epoch=0``) that survive every change of nodes."""

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 path: str | Path | None = None, durable: bool = True, **extra: Any):  # fmt: skip
        """``path``: where commits go (default: the job's in the run directory); ``durable=False``: nowhere."""
        self.model = model
        self.optimizer = optimizer
        self.path = None if not durable else Path(path) if path is not None else checkpoint_path()
        self.keys = list(extra)
        for key, value in extra.items():
            setattr(self, key, value)
        self._held = False  # a provisional worker resumed from the commit its node holds in memory
        membership = inplace.active()
        self._index = membership.register_state(self) if membership is not None else 0
        if membership is not None and membership.provisional:
            # A worker joining a job that trains gets its state from a peer at its first batch (or, restarted after a
            # hard loss, from the last commit its node holds in memory): nothing is read here.
            self.restored = self._resume_from_memory(membership)
        else:
            self.restored = self.restore()
        if model is not None:
            from ..describe import watch

            watch(model)  # rank 0 describes the model on its first forward pass: the similarity policy's input

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict() if self.model is not None else None,
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "extra": {k: (v.state_dict() if stateful(v) else v) for k in self.keys for v in [getattr(self, k)]},
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        if self.model is not None and saved.get("model") is not None:
            self.model.load_state_dict(saved["model"])
        if self.optimizer is not None and saved.get("optimizer") is not None:
            self.optimizer.load_state_dict(saved["optimizer"])
        for key, value in saved.get("extra", {}).items():
            if key in self.keys and stateful(getattr(self, key)):
                # the loader: restored in place, where the training loop holds it
                getattr(self, key).load_state_dict(value)
            elif key in self.keys:
                setattr(self, key, value)

    def commit(self) -> None:
        """Rank 0 saves the state durably, each node's local rank 0 keeps it in memory; the others carry on (their
        state is the same)."""
        membership = inplace.active()
        if membership is not None and membership.provisional:
            return  # not the job's state yet: it comes when this worker joins
        durable = self.path is not None and rank() == 0
        held = membership is not None and membership.local_rank == 0
        if not (durable or held):
            return
        payload = self.state_dict()
        if held:
            self._keep_in_memory(membership, payload)
        if durable:
            self._save(payload)

    def _save(self, payload: dict[str, Any]) -> None:
        assert self.path is not None
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself
        finally:
            os.close(fd)
        committed()  # now durable: the controller's count of the job's progress will not fall back past here

    def restore(self) -> bool:
        """Load the last commit on every rank (rank 0 reads, then broadcasts); True if there was one."""
        saved = self._read() if rank() == 0 else None
        if _distributed() and dist.get_world_size() > 1:
            box = [saved]
            dist.broadcast_object_list(box, src=0)
            saved = box[0]
        if saved is None:
            return False
        self.load_state_dict(saved)
        return True

    def _read(self) -> dict[str, Any] | None:
        """The durable commit (rank 0), or None."""
        if self.path is None:
            return None
        for stale in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            stale.unlink(missing_ok=True)  # a commit cut short when its writer was stopped
        if not self.path.exists():
            return None
        from ..checkpoints import check_private

        check_private(self.path, self.path.parent)  # a pickle: loaded only if nobody else could have written it
        return torch.load(self.path, map_location="cpu", weights_only=False)

    # ------------------------------------------------------------ in-place resize (pilotfill.elastic.torch.inplace)

    def _payload(self, from_disk: bool) -> dict[str, Any] | None:
        """What this rank sends a joining rank: the state it holds, or (nobody holds one) the durable commit — or,
        without one, its own state, so that every rank starts from the same."""
        if from_disk:
            saved = self._read()
            if saved is not None:
                return {"state": saved, "restored": True}
        return {"state": self.state_dict(), "restored": self.restored}

    def _take(self, payload: dict[str, Any] | None, from_disk: bool) -> None:
        """The state a peer sent (model, optimizer, the loader's position, named values): this rank's from now on."""
        if payload is None:
            return
        self.load_state_dict(payload["state"])
        self.restored = bool(payload.get("restored")) if from_disk else self.restored or self._held

    def _keep_in_memory(self, membership: Any, payload: dict[str, Any]) -> None:
        """This commit, in the node's memory, for a worker of it restarted after a hard loss."""
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        try:
            inplace.write_atomically(inplace.commit_path(membership.dir, self._index), buffer.getvalue())
        except OSError:
            pass  # no room in memory: a restarted worker takes the state from a peer, or the durable commit

    def _resume_from_memory(self, membership: Any) -> bool:
        """A worker restarted after a hard loss resumes from the commit its node holds in memory, if any."""
        path = inplace.commit_path(membership.dir, self._index)
        try:
            saved = torch.load(path, map_location="cpu", weights_only=False)
        except (OSError, EOFError, RuntimeError, ValueError):
            return False
        self.load_state_dict(saved)
        self._held = True
        return False
