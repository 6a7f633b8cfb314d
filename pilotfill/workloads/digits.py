"""Real elastic training: a small MLP on scikit-learn's digits, on either elastic runtime.

``PILOTFILL_RUNTIME=torch`` (set by the torch runtime): plain
``torch.distributed`` with gloo and ``DistributedDataParallel``, state in
pilotfill's durable :class:`~pilotfill.elastic.state.ElasticState`; torch
elastic restarts the workers on every membership change and they resume from
the last commit. Otherwise: ``horovod.torch`` with ``hvd.elastic.run`` and the
durable ``TorchState``. Either way pilotfill adds one ``report`` line. Each
epoch re-shards the training set over the ranks there are now, so growing and
shrinking change how much each rank does, not what is learned. Rank 0 returns
the validation accuracy: that is the job's result.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from ..report import report


def make_model(depth: int, width: int, activation: str) -> torch.nn.Module:
    act = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh, "gelu": torch.nn.GELU}[activation]
    layers, last = [], 64
    for _ in range(depth):
        layers += [torch.nn.Linear(last, width), act()]
        last = width
    layers.append(torch.nn.Linear(last, 10))
    return torch.nn.Sequential(*layers)


def data(seed: int = 0):
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    xtr, xva, ytr, yva = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    return torch.from_numpy(xtr), torch.from_numpy(ytr), torch.from_numpy(xva), torch.from_numpy(yva)


def train(epochs: int = 20, depth: int = 2, width: int = 64, activation: str = "relu", lr: float = 0.05, batch: int = 32, seed: int = 0,
          step_delay_s: float = 0.0, fail_at_epoch: int | None = None, durable: bool = True) -> dict:
    """Train elastically; returns {"val_accuracy", "epochs", "restored", "size_at_end"} from rank 0."""
    if os.environ.get("PILOTFILL_RUNTIME") == "torch":
        return train_torch(epochs, depth, width, activation, lr, batch, seed, step_delay_s, fail_at_epoch, durable)
    return train_horovod(epochs, depth, width, activation, lr, batch, seed, step_delay_s, fail_at_epoch, durable)


def _epochs(state, forward, optimizer, xtr, ytr, rank_size, epochs: int, batch: int, seed: int, step_delay_s: float,
            fail_at_epoch: int | None) -> None:  # fmt: skip
    """The training loop both runtimes share: this rank's shard of each epoch, a commit every 4 steps.

    (epoch, batch) only ever increases — the end of an epoch is the start of the next — so a restart
    from any commit resumes at the right step, on however many ranks there are then (``rank_size()``).
    """
    while state.epoch < epochs:
        if fail_at_epoch is not None and state.epoch >= fail_at_epoch:
            raise RuntimeError(f"training diverged at epoch {state.epoch} (as asked)")
        rank, size = rank_size()
        order = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(seed + state.epoch))
        mine = order[rank::size]
        steps = (len(xtr) // size) // batch  # the same on every rank: DDP's collectives pair up step for step
        while state.batch < steps:
            idx = mine[state.batch * batch : (state.batch + 1) * batch]
            optimizer.zero_grad()
            F.cross_entropy(forward(xtr[idx]), ytr[idx]).backward()
            optimizer.step()
            report(samples=len(idx))
            if step_delay_s:
                time.sleep(step_delay_s)
            state.batch += 1
            if state.batch % 4 == 0:
                state.commit()
        state.epoch, state.batch = state.epoch + 1, 0
        state.commit()


def train_torch(epochs: int, depth: int, width: int, activation: str, lr: float, batch: int, seed: int,
                step_delay_s: float, fail_at_epoch: int | None, durable: bool) -> dict:
    """Plain torch.distributed (gloo); a restart resumes from the last commit of ElasticState."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from ..elastic.state import ElasticState

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    xtr, ytr, xva, yva = data(seed)
    model = make_model(depth, width, activation)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    state = ElasticState(model, optimizer, durable=durable, epoch=0, batch=0)
    ddp = DistributedDataParallel(model)
    _epochs(state, ddp, optimizer, xtr, ytr, lambda: (rank, size), epochs, batch, seed, step_delay_s, fail_at_epoch)
    with torch.no_grad():
        accuracy = float((model(xva).argmax(1) == yva).float().mean())
    return {"val_accuracy": accuracy, "epochs": epochs, "restored": state.restored, "size_at_end": size}


def train_horovod(epochs: int, depth: int, width: int, activation: str, lr: float, batch: int, seed: int,
                  step_delay_s: float, fail_at_epoch: int | None, durable: bool) -> dict:
    """Elastic Horovod; hvd.elastic.run keeps the ranks' state across membership changes in memory."""
    import horovod.torch as hvd

    from ..elastic.torch_state import TorchState

    hvd.init()
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    xtr, ytr, xva, yva = data(seed)
    model = make_model(depth, width, activation)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    state_cls = TorchState if durable else hvd.elastic.TorchState
    state = state_cls(model, optimizer, epoch=0, batch=0)
    restored = bool(getattr(state, "restored_from_disk", False))

    @hvd.elastic.run
    def loop(state) -> float:
        _epochs(state, model, optimizer, xtr, ytr, lambda: (hvd.rank(), hvd.size()), epochs, batch, seed, step_delay_s, fail_at_epoch)
        with torch.no_grad():
            return float((model(xva).argmax(1) == yva).float().mean())

    accuracy = loop(state)
    return {"val_accuracy": accuracy, "epochs": epochs, "restored": restored, "size_at_end": hvd.size()}
