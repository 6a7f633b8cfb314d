"""Real elastic training: a small MLP on scikit-learn's digits, on either elastic runtime.

``PILOTFILL_RUNTIME=torch`` (set by the torch runtime): plain
``torch.distributed`` with gloo and ``DistributedDataParallel``, state in
pilotfill's durable :class:`~pilotfill.elastic.state.ElasticState`; torch
elastic restarts the workers on every membership change and they resume from
the last commit. Otherwise: ``horovod.torch`` with ``hvd.elastic.run`` and the
durable ``TorchState``. Either way the data comes from an
:class:`~pilotfill.elastic.loader.ElasticLoader`: every optimizer step takes one
global batch of ``batch`` samples of one seeded order per epoch, split over the
ranks there are now, and the commits carry its position — so what is learned
does not depend on the nodes the job had, and every sample is trained once per
epoch. Rank 0 returns the validation accuracy: that is the job's result.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import Dataset, TensorDataset

from ..elastic.loader import Batch, ElasticLoader

COMMIT_EVERY = 4
"""Steps between commits (and one at each epoch's end): a stop loses at most this many."""


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


def train_set(x: torch.Tensor, y: torch.Tensor) -> Dataset:
    """The training samples as the loader reads them (a test swaps in one that records what each rank was given)."""
    return TensorDataset(x, y)


def train(
    epochs: int = 20,
    depth: int = 2,
    width: int = 64,
    activation: str = "relu",
    lr: float = 0.05,
    batch: int = 32,
    seed: int = 0,
    step_delay_s: float = 0.0,
    fail_at_epoch: int | None = None,
    durable: bool = True,
    micro_batch: int | None = None,
    on_step: Callable[[Batch], None] | None = None,
) -> dict:
    """Train elastically; returns {"val_accuracy", "epochs", "restored", "size_at_end"} from rank 0.

    ``batch``: samples per optimizer step, whatever the world size (the global batch); ``micro_batch``: the most a rank
    forwards at once; ``step_delay_s``: what a step would take on one rank (each rank sleeps its share: a model bigger
    than this one, as the allocator sees it); ``on_step(batch)``: called after each optimizer step (tests pace and
    watch training with it)."""
    loop = (train_torch if os.environ.get("PILOTFILL_RUNTIME") == "torch" else train_horovod)
    return loop(
        epochs, depth, width, activation, lr, batch, seed, step_delay_s, fail_at_epoch, durable, micro_batch, on_step
    )


def _epochs(state, loader: ElasticLoader, forward: torch.nn.Module, optimizer, epochs: int, step_delay_s: float,
            fail_at_epoch: int | None, on_step: Callable[[Batch], None] | None) -> None:  # fmt: skip
    """The training loop both runtimes share: a global batch per step, a commit every few steps and at each epoch's end.

    The loader's position is in every commit, so a restart from any of them resumes at the next global sample, on
    however many ranks there are then. ``epoch`` and ``batch`` (steps into the epoch) say where a commit is to whoever
    reads it; the loader's position is what resumes."""
    while loader.epoch < epochs:
        if fail_at_epoch is not None and loader.epoch >= fail_at_epoch:
            raise RuntimeError(f"training diverged at epoch {loader.epoch} (as asked)")
        for step in loader:
            optimizer.zero_grad()
            step.backward(lambda x, y: F.cross_entropy(forward(x), y), forward)
            optimizer.step()
            if step_delay_s:
                time.sleep(step_delay_s * len(step.indices) / step.size)  # its share of the step: more ranks, faster
            if on_step is not None:
                on_step(step)
            if (step.step + 1) % COMMIT_EVERY == 0:
                state.epoch, state.batch = loader.epoch, step.step + 1
                state.commit()
        state.epoch, state.batch = loader.epoch, 0
        state.commit()


def train_torch(
    epochs: int,
    depth: int,
    width: int,
    activation: str,
    lr: float,
    batch: int,
    seed: int,
    step_delay_s: float,
    fail_at_epoch: int | None,
    durable: bool,
    micro_batch: int | None = None,
    on_step: Callable[[Batch], None] | None = None,
) -> dict:
    """Plain torch.distributed (gloo); a restart resumes from the last commit of ElasticState."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from ..elastic.state import ElasticState

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    xtr, ytr, xva, yva = data(seed)
    model = make_model(depth, width, activation)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loader = ElasticLoader(train_set(xtr, ytr), global_batch=batch, seed=seed, micro_batch=micro_batch)
    state = ElasticState(model, optimizer, durable=durable, loader=loader, epoch=0, batch=0)
    ddp = DistributedDataParallel(model)
    _epochs(state, loader, ddp, optimizer, epochs, step_delay_s, fail_at_epoch, on_step)
    with torch.no_grad():
        accuracy = float((model(xva).argmax(1) == yva).float().mean())
    return {
        "val_accuracy": accuracy,
        "epochs": epochs,
        "restored": state.restored,
        "size_at_end": dist.get_world_size(),
    }


def train_horovod(
    epochs: int,
    depth: int,
    width: int,
    activation: str,
    lr: float,
    batch: int,
    seed: int,
    step_delay_s: float,
    fail_at_epoch: int | None,
    durable: bool,
    micro_batch: int | None = None,
    on_step: Callable[[Batch], None] | None = None,
) -> dict:
    """Elastic Horovod; hvd.elastic.run keeps the ranks' state, the loader's position with it,
    across membership changes."""
    import horovod.torch as hvd

    from ..elastic.horovod_state import TorchState

    hvd.init()
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    xtr, ytr, xva, yva = data(seed)
    model = make_model(depth, width, activation)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    loader = ElasticLoader(train_set(xtr, ytr), global_batch=batch, seed=seed, micro_batch=micro_batch)
    state_cls = TorchState if durable else hvd.elastic.TorchState
    state = state_cls(model, optimizer, loader=loader, epoch=0, batch=0)
    restored = bool(getattr(state, "restored_from_disk", False))

    @hvd.elastic.run
    def loop(state) -> float:
        _epochs(state, loader, model, optimizer, epochs, step_delay_s, fail_at_epoch, on_step)
        with torch.no_grad():
            return float((model(xva).argmax(1) == yva).float().mean())

    accuracy = loop(state)
    return {"val_accuracy": accuracy, "epochs": epochs, "restored": restored, "size_at_end": hvd.size()}
