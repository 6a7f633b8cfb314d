"""A Horovod ``TorchState`` whose every commit also lands on disk, so a restarted job resumes.

Horovod's own ``hvd.elastic.TorchState`` keeps the last commit in memory: it
survives ranks coming and going, not the job being stopped and started again
(a controller crash, a job that lost all its nodes). This subclass writes each
commit from rank 0 to ``checkpoints/<job>.pt`` in the run directory,
atomically (write, fsync, rename), and loads it when constructed, so the job
picks up at its last commit. Code that uses Horovod's ``TorchState`` runs
unchanged; it just starts from the beginning after a crash.

    from pilotfill.elastic import ElasticLoader, TorchState
    loader = ElasticLoader(dataset, global_batch=256, seed=0)
    state = TorchState(model, optimizer, loader=loader)   # the loader's position is committed, restored and synced too

An :class:`~pilotfill.elastic.loader.ElasticLoader` among the named values is
handled as Horovod handles its own ``ElasticSampler``: saved at each commit,
restored after a lost rank, broadcast from rank 0 to joiners; durably, its
``state_dict`` is written with the model (the format ``ElasticState`` reads).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import horovod.torch as hvd
import torch
from horovod.torch.elastic.state import StateHandler, get_handler_registry, set_handler_registry
from horovod.torch.functions import broadcast_object

from ..checkpoints import checkpoint_path
from ..report import committed
from .loader import ElasticLoader
from .state import stateful


class LoaderStateHandler(StateHandler):
    """Horovod's in-memory life of an :class:`ElasticLoader`'s position, as of its ``ElasticSampler``'s."""

    def __init__(self, loader: ElasticLoader):
        super().__init__(loader)
        self._saved = loader.state_dict()

    def save(self) -> None:
        self._saved = self.value.state_dict()

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))


if not any(kind is ElasticLoader for kind, _ in get_handler_registry()):
    set_handler_registry([*get_handler_registry(), (ElasticLoader, LoaderStateHandler)])


class TorchState(hvd.elastic.TorchState):
    """``hvd.elastic.TorchState`` plus a durable copy of every commit."""

    def __init__(self, model=None, optimizer=None, path: str | Path | None = None, **kwargs: Any):
        durable_path = Path(path) if path is not None else checkpoint_path()
        saved = self._load(durable_path)
        if saved is not None:
            if model is not None:
                model.load_state_dict(saved["model"])
            if optimizer is not None and saved.get("optimizer") is not None:
                optimizer.load_state_dict(saved["optimizer"])
            for key, value in saved["extra"].items():
                if key in kwargs and stateful(kwargs[key]):
                    # the loader: restored in place, where the training loop holds it
                    kwargs[key].load_state_dict(value)
                elif key in kwargs:
                    kwargs[key] = value
        # Horovod's ObjectState routes attribute writes through handlers set up in __init__:
        # plain attributes go in with object.__setattr__.
        object.__setattr__(self, "_durable_path", durable_path)
        object.__setattr__(self, "_durable_keys", list(kwargs))
        object.__setattr__(self, "restored_from_disk", saved is not None)
        super().__init__(model=model, optimizer=optimizer, **kwargs)

    def save(self) -> None:
        super().save()
        if self._durable_path is None or hvd.rank() != 0:
            return
        payload = {
            "model": self.model.state_dict() if getattr(self, "model", None) is not None else None,
            "optimizer": self.optimizer.state_dict() if getattr(self, "optimizer", None) is not None else None,
            "extra": {
                k: (v.state_dict() if stateful(v) else v) for k in self._durable_keys for v in [getattr(self, k)]
            },
        }
        self._durable_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self._durable_path.with_name(f".{self._durable_path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._durable_path)
        committed()  # now durable: the controller's count of the job's progress will not fall back past here

    @staticmethod
    def _load(path: Path | None) -> dict[str, Any] | None:
        if path is None or not path.exists():
            return None
        from ..checkpoints import check_private

        check_private(path, path.parent)  # a pickle: loaded only if nobody else could have written it
        return torch.load(path, map_location="cpu", weights_only=False)
