"""``ElasticLoader``: what a job learns does not depend on how many ranks it had.

pilotfill changes a job's world size many times an hour. A loader that splits
an epoch over "the ranks there are" (``DistributedSampler``, ``order[rank::size]``)
makes the optimizer step, and so the model, depend on the allocation, and a
resize mid-epoch skips or repeats samples. This one keeps the optimisation the
same on any world size:

* one seeded global order per epoch (``seed``, ``epoch``), the same on every rank;
* each step consumes exactly one **global batch** of ``global_batch`` samples of
  that order, split over the ranks there are now in contiguous shares that
  differ by at most one sample; a share above ``micro_batch`` is taken in
  micro-batches with gradient accumulation (DDP's ``no_sync``);
* each micro-batch carries the factor its per-sample-mean loss is scaled by,
  ``len(micro) * world / batch.size``: DDP and Horovod average gradients over
  the world, so the step's gradient is the mean over the whole global batch
  whatever the split (``batch.backward`` does it all; Horovod's micro-batches
  before the last accumulate without firing its all-reduce);
* the job's position is the count of global samples consumed (``epoch`` and
  ``offset``); it is in every commit (``ElasticState(..., loader=loader)``,
  Horovod's ``TorchState`` likewise), so a resume on any world size continues at
  the same sample: every sample once per epoch;
* rank 0 reports each global batch to the controller as it hands it out, with
  the position (``pilotfill.report``): the job's progress is its position, and
  what a stop makes it do again is counted redone exactly.

The samples an epoch's order has beyond its last full global batch join that
batch (so no step is smaller than the one the allocator sized the job for),
unless ``drop_last``; either way it is the same on any world size. Built on
``torch.utils.data``: a batch sampler and a ``DataLoader`` (workers, pinning,
``collate_fn`` as usual); tensors are fetched a batch at a time.

    loader = ElasticLoader(TensorDataset(x, y), global_batch=256, seed=0)
    state = ElasticState(model, optimizer, loader=loader)   # restores the position with the model
    ddp = DistributedDataParallel(model)
    while loader.epoch < EPOCHS:
        for batch in loader:                                  # this rank's share of one global batch
            optimizer.zero_grad()
            batch.backward(lambda x, y: F.cross_entropy(ddp(x), y), ddp)
            optimizer.step()
        state.commit()
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

from ..report import report
from .torch import inplace
from .adaptive import Adaptive, GradientNoise

GLOBAL_BATCH_ENV = "PILOTFILL_GLOBAL_BATCH"
"""Set on the ranks by ``elastic_app(global_batch=…)``: the loader's global batch when it names none, and the least it
may name (the allocator sized the job for it)."""

_RESERVED = {"batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"}


def shares(size: int, world: int) -> list[tuple[int, int]]:
    """Each rank's ``[start, end)`` of a global batch of ``size``: contiguous, by rank,
    sizes differing by at most one."""
    base, extra = divmod(size, world)
    out, start = [], 0
    for rank in range(world):
        end = start + base + (rank < extra)
        out.append((start, end))
        start = end
    return out


def pieces(start: int, end: int, count: int) -> list[tuple[int, int]]:
    """``[start, end)`` in ``count`` contiguous micro-batches, sizes differing by at most one, empty ones first (the
    last one is the one that synchronises gradients, so it must not be empty while the share is not)."""
    base, extra = divmod(end - start, count)
    out = []
    for i in range(count):
        n = base + (i >= count - extra)
        out.append((start, start + n))
        start += n
    return out


def current_world() -> tuple[int, int]:
    """(rank, world size) of the data-parallel group this process is in: torch.distributed's, else Horovod's, else (0,
    1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and hvd.is_initialized():
        return hvd.rank(), hvd.size()
    return 0, 1


def _grouped() -> bool:
    """Whether this process is in a torch.distributed or Horovod group (of one, maybe: it can grow)."""
    import torch.distributed as dist

    hvd = sys.modules.get("horovod.torch")
    return (dist.is_available() and dist.is_initialized()) or (hvd is not None and hvd.is_initialized())


@dataclass(slots=True)
class Micro:
    """One micro-batch of a rank's share: its data as the ``DataLoader`` collated it, the factor its per-sample-mean
    loss is scaled by (0 for an empty share, forwarded only to keep an idle rank in step), and the dataset indices it
    holds."""

    data: Any
    scale: float
    indices: tuple[int, ...]


@dataclass(slots=True)
class Batch:
    """This rank's share of one global batch: ``size`` samples at ``start`` of epoch ``epoch``'s order,
    ``world`` ranks."""

    epoch: int
    start: int
    size: int
    step: int
    rank: int
    world: int
    micro: tuple[Micro, ...] = field(repr=False)
    lr_factor: float = 1.0  # with an adaptive batch: what the learning rate tuned at its base batch is scaled by
    # after its backward (adaptive, measuring)
    measured: Callable[[Batch], None] | None = field(default=None, repr=False)

    @property
    def indices(self) -> tuple[int, ...]:
        """The dataset indices this rank trains on in this step."""
        return tuple(i for m in self.micro for i in m.indices)

    @property
    def data(self) -> Any:
        """The share's data, where it is one micro-batch (else ``backward`` or ``micro``: it was fetched in parts)."""
        if len(self.micro) != 1:
            raise ValueError(
                f"this share is {len(self.micro)} micro-batches: use batch.backward(...) or iterate batch.micro"
            )
        return self.micro[0].data

    @property
    def scale(self) -> float:
        """The factor the share's per-sample-mean loss is scaled by, where it is one micro-batch."""
        if len(self.micro) != 1:
            raise ValueError(
                f"this share is {len(self.micro)} micro-batches, each with its own scale: iterate batch.micro"
            )
        return self.micro[0].scale

    def backward(self, loss: Callable[..., torch.Tensor], model: torch.nn.Module | None = None) -> torch.Tensor:
        """Forward and backward the share, micro-batch by micro-batch, each loss scaled so that the gradient the
        optimizer steps with is the mean over the whole global batch on any world size.

        ``loss(*data)`` returns a per-sample-mean loss (``F.cross_entropy(ddp(x), y)``); ``model``: what ``loss``
        calls — a ``DistributedDataParallel`` (the micro-batches before the last run under its ``no_sync``), or,
        under Horovod, the module ``hvd.DistributedOptimizer`` wraps (their gradients accumulate without firing its
        all-reduce). Returns this rank's part of the global batch's mean loss (summed over ranks: the mean)."""
        last = len(self.micro) - 1
        if last and model is None:
            raise ValueError(
                f"this share is {len(self.micro)} micro-batches: batch.backward(loss, model) needs the model, so that "
                "they accumulate before the gradients are all-reduced"
            )
        no_sync = getattr(model, "no_sync", None)
        params = (
            [p for p in model.parameters() if p.requires_grad] if model is not None and no_sync is None and last else []
        )
        total: torch.Tensor | None = None
        for i, micro in enumerate(self.micro):
            args = micro.data if isinstance(micro.data, (tuple, list)) else (micro.data,)
            if i < last and no_sync is not None:
                with no_sync():
                    value = loss(*args)
                    (value * micro.scale).backward()
            elif i < last and params:
                value = loss(*args)
                # no AccumulateGrad: no hook fires
                grads = torch.autograd.grad(value * micro.scale, params, allow_unused=True)
                for p, g in zip(params, grads):
                    if g is not None:
                        p.grad = g if p.grad is None else p.grad.add_(g)
            else:
                value = loss(*args)
                (value if micro.scale == 1.0 else value * micro.scale).backward()
            if micro.scale:
                part = value.detach() if micro.scale == self.world else value.detach() * (micro.scale / self.world)
                total = part if total is None else total + part
        if self.measured is not None:
            self.measured(self)
        return total if total is not None else torch.zeros(())


class _Tensors(Dataset):
    """Tensors indexed a batch at a time (one ``x[idx]`` per tensor, not one item each and a stack)."""

    def __init__(self, tensors: Sequence[torch.Tensor]):
        if not tensors or any(len(t) != len(tensors[0]) for t in tensors):
            raise ValueError("ElasticLoader: tensors must be given with the same first dimension")
        self.tensors = tuple(tensors)

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        return tuple(t[index] for t in self.tensors)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return tuple(t[idx] for t in self.tensors)


def _batches(length: int, size: int, drop_last: bool = False) -> list[int]:
    """``length`` samples as steps of ``size``, the rest folded into the last (or dropped with ``drop_last``)."""
    full, rest = divmod(length, size)
    sizes = [size] * full
    if rest and not drop_last:
        if sizes:
            sizes[-1] += rest
        else:
            sizes = [rest]  # fewer samples than one batch
    return sizes


class _LocalNorm:
    """A rank's squared gradient norm before the all-reduce, summed over its buckets (a tensor: no device sync)."""

    def __init__(self) -> None:
        self.sq: torch.Tensor | None = None

    def take(self) -> float:
        value, self.sq = self.sq, None
        return float(value) if value is not None else 0.0


def _measuring_allreduce(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks a hook's annotations: none here
    """DDP's own all-reduce, after adding this rank's bucket to its squared norm."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    part = bucket.buffer().detach().double().pow(2).sum()
    state.sq = part if state.sq is None else state.sq + part
    return allreduce_hook(None, bucket)


def _none_of(data: Any) -> Any:
    """A batch of no samples shaped like ``data``: every tensor in it cut to length 0."""
    if isinstance(data, torch.Tensor):
        return data[:0]
    if isinstance(data, (tuple, list)):
        return type(data)(_none_of(d) for d in data)
    if isinstance(data, dict):
        return {k: _none_of(v) for k, v in data.items()}
    return data


def _whole(batch: Any) -> Any:
    """The collate function of tensors fetched a batch at a time: the batch as it came."""
    return batch


@dataclass(slots=True)
class _Step:
    start: int
    size: int
    fetches: tuple[tuple[int, int, float], ...]  # (start, end) in the epoch's order of each micro-batch, and its scale


class _ShareSampler(Sampler[list[int]]):
    """The batch sampler under the ``DataLoader``:
    the index lists of this rank's micro-batches for the steps planned."""

    def __init__(self, empty_fetch: bool) -> None:
        self.order = np.zeros(0, dtype=np.int64)
        self.steps: list[_Step] = []
        self.empty_fetch = empty_fetch  # the dataset answers an empty list of indices with an empty batch

    def __iter__(self) -> Iterator[list[int]]:
        order = self.order
        for step in self.steps:
            for start, end, _ in step.fetches:
                if end > start or self.empty_fetch:
                    yield order[start:end].tolist()
                else:
                    # one sample, to know the shape of an empty share (cut to none)
                    yield order[step.start : step.start + 1].tolist()

    def __len__(self) -> int:
        return sum(len(step.fetches) for step in self.steps)


class ElasticLoader:
    """Global batches of one seeded order per epoch, each split over the ranks there are now (module docstring)."""

    def __init__(
        self,
        data: Dataset | torch.Tensor | Sequence[torch.Tensor],
        global_batch: int | Adaptive | None = None,
        *,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        micro_batch: int | None = None,
        report: bool = True,
        world: Callable[[], tuple[int, int]] | None = None,
        **dataloader: Any,
    ):
        """``global_batch``: samples per optimizer step, whatever the world size (default: the app's
        ``elastic_app(global_batch=…)``), or :class:`.Adaptive`: a batch that grows with the ranks, which changes what
        is learned (:mod:`pilotfill.elastic.adaptive`); ``micro_batch``: the most samples a rank forwards at once;
        ``report``: rank 0 tells the controller of each global batch (``pilotfill.report``); ``world``: returns
        (rank, world size), default torch.distributed's or Horovod's; the rest goes to ``DataLoader`` (workers,
        ``collate_fn``, ``pin_memory``, …)."""
        declared = os.environ.get(GLOBAL_BATCH_ENV)
        self.adaptive = global_batch if isinstance(global_batch, Adaptive) else None
        if self.adaptive is not None:
            if drop_last:
                raise ValueError(
                    "ElasticLoader: an adaptive batch keeps every sample (drop_last=False): its batches change size "
                    "with the ranks"
                )
            # the declaration is the largest batch (the ranks it feeds)
            global_batch, declared = self.adaptive.base_batch, None
        if global_batch is None:
            if not declared:
                raise ValueError(
                    "ElasticLoader needs a global batch: ElasticLoader(data, global_batch=256), or "
                    "elastic_app(global_batch=256)"
                )
            global_batch = int(declared)
        elif declared and isinstance(global_batch, int) and global_batch < int(declared):
            raise ValueError(
                f"ElasticLoader(global_batch={global_batch}) is smaller than the {declared} the app declares "
                "(elastic_app(global_batch=…)): "
                "the allocator gives the job as many ranks as the declaration feeds, so some would idle; declare the "
                "smallest"
            )
        if not isinstance(global_batch, int) or isinstance(global_batch, bool) or global_batch < 1:
            raise ValueError(f"ElasticLoader: global_batch must be an integer >= 1, got {global_batch!r}")
        if micro_batch is not None and (not isinstance(micro_batch, int) or micro_batch < 1):
            raise ValueError(f"ElasticLoader: micro_batch must be an integer >= 1 or None, got {micro_batch!r}")
        if _RESERVED & set(dataloader):
            raise ValueError(
                f"ElasticLoader: {', '.join(sorted(_RESERVED & set(dataloader)))} is the loader's own (global_batch, "
                "seed, drop_last)"
            )
        if isinstance(data, torch.Tensor):
            data = _Tensors((data,))
        elif isinstance(data, (tuple, list)) and data and all(isinstance(t, torch.Tensor) for t in data):
            data = _Tensors(data)
        elif type(data) is TensorDataset:
            data = _Tensors(data.tensors)  # the same samples, fetched a batch at a time
        if isinstance(data, _Tensors):
            dataloader.setdefault("collate_fn", _whole)
        self.dataset = data
        self.length = len(data)  # type: ignore[arg-type]
        if self.length < 1:
            raise ValueError("ElasticLoader: the dataset is empty")
        self.global_batch, self.seed, self.shuffle, self.drop_last = global_batch, int(seed), shuffle, drop_last
        self.micro_batch, self.report = micro_batch, report
        self._sizes = self._epoch_sizes()
        self._per_epoch = sum(self._sizes)
        self._world = world or current_world
        self.epoch, self.offset = 0, 0
        self._sampler = _ShareSampler(empty_fetch=isinstance(data, _Tensors))
        self._loader = DataLoader(data, batch_sampler=self._sampler, **dataloader)
        self._order_of: tuple[int, np.ndarray] | None = None
        self._warned = False
        self.noise = GradientNoise()  # an adaptive batch's gradient statistics (measured on 2+ ranks: adapt(…, ddp))
        self._optimizer: torch.optim.Optimizer | None = None
        self.base_lrs: list[float] = []
        self._local_sq: _LocalNorm | None = None
        self._params: list[torch.Tensor] = []

    # ------------------------------------------------------------ where the job is

    @property
    def epoch_samples(self) -> int:
        """Samples one epoch consumes: the whole dataset, or its full global batches with ``drop_last``."""
        return self._per_epoch

    @property
    def position(self) -> int:
        """Global samples consumed since the job began, over every epoch: what a resume continues from."""
        return self.epoch * self.epoch_samples + self.offset

    def __len__(self) -> int:
        """Optimizer steps in one epoch."""
        return len(self._sizes)

    def order(self, epoch: int) -> torch.Tensor:
        """Epoch ``epoch``'s order of the dataset's indices: the same on every rank and every world size."""
        return torch.from_numpy(self._order(epoch))

    def _order(self, epoch: int) -> np.ndarray:
        if self._order_of is None or self._order_of[0] != epoch:
            if self.shuffle:
                order = np.random.default_rng([self.seed, epoch]).permutation(self.length)  # (seed, epoch) mixed whole
            else:
                order = np.arange(self.length)
            self._order_of = (epoch, order.astype(np.int64))
        return self._order_of[1]

    def state_dict(self) -> dict[str, Any]:
        out = {
            "epoch": self.epoch,
            "offset": self.offset,
            "position": self.position,
            "global_batch": self.global_batch,
            "seed": self.seed,
            "length": self.length,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }
        if self.adaptive is not None:
            out.update(adaptive=self.adaptive.to_spec(), noise=self.noise.state_dict(), base_lrs=list(self.base_lrs))
        return out

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Continue at a commit's position (taken on any world size)."""
        for key in ("length", "seed", "shuffle", "drop_last"):
            if key in saved and saved[key] != getattr(self, key):
                raise ValueError(
                    f"ElasticLoader: the commit was made with {key}={saved[key]!r}, this loader has "
                    f"{getattr(self, key)!r}: resuming would not continue the same order"
                )
        self.epoch, self.offset = int(saved["epoch"]), int(saved["offset"])
        if self.adaptive is not None and saved.get("noise") is not None:
            # what it measured, and the rates the app set (not the scaled ones)
            self.noise.load_state_dict(saved["noise"])
            self.base_lrs = [float(v) for v in saved.get("base_lrs") or self.base_lrs]

    # ------------------------------------------------------------ an adaptive batch

    def adapt(self, optimizer: torch.optim.Optimizer, ddp: torch.nn.Module | None = None) -> None:
        """With an adaptive batch: scale ``optimizer``'s learning rates (as set now: tuned at the base batch) by the
        rule's factor at every step; with ``ddp`` (a ``DistributedDataParallel``), measure the gradient's noise at every
        step on two or more ranks (a communication hook: each rank's gradient before the all-reduce) — what AdaScale's
        gain and the allocator's efficiency rest on. Call it once, before training."""
        if self.adaptive is None:
            raise ValueError(
                "ElasticLoader.adapt: this loader's global batch is fixed (ElasticLoader(..., "
                "global_batch=Adaptive(…)) adapts)"
            )
        self._optimizer = optimizer
        if not self.base_lrs:  # a restored commit brought the rates the app set; otherwise they are these
            self.base_lrs = [float(group["lr"]) for group in optimizer.param_groups]
        if ddp is not None and hasattr(ddp, "register_comm_hook") and self._local_sq is None:
            self._local_sq = _LocalNorm()
            self._params = [p for p in ddp.parameters() if p.requires_grad]
            ddp.register_comm_hook(self._local_sq, _measuring_allreduce)

    def _scale_lr(self, size: int) -> float:
        """Set the optimizer's rates for a step of ``size`` samples; returns the factor (1 with a fixed batch)."""
        if self.adaptive is None:
            return 1.0
        factor = self.adaptive.lr_factor(size, self.noise)
        if self._optimizer is not None:
            for group, base in zip(self._optimizer.param_groups, self.base_lrs):
                group["lr"] = base * factor
        return factor

    def _measure(self, batch: Batch) -> None:
        """After a step's backward on 2+ ranks: each rank's share gradient and the step's (now all-reduced) gradient."""
        import torch.distributed as dist

        assert self._local_sq is not None
        local = self._local_sq.take()
        share = len(batch.indices)
        share_sq = local * (batch.size / (share * batch.world)) ** 2 if share else 0.0  # the loader's loss scale undone
        grads = [p.grad.detach() for p in self._params if p.grad is not None]
        global_sq = (
            float(
                torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads]))
                ** 2
            )
            if grads
            else 0.0
        )
        sums = torch.tensor([share_sq, 1.0 / share if share else 0.0, 1.0 if share else 0.0], dtype=torch.float64)
        dist.all_reduce(sums)
        if sums[2] >= 2:
            self.noise.update(float(sums[0] / sums[2]), float(sums[1] / sums[2]), global_sq, batch.size)

    # ------------------------------------------------------------ the steps

    def _epoch_sizes(self) -> list[int]:
        """The global batches of an epoch: ``global_batch`` each, the rest of the order folded into the last one (so
        no step is ever smaller than the allocator sized the job for), or dropped with ``drop_last``."""
        return _batches(self.length, self.global_batch, self.drop_last)

    def _sizes_from(self, world: int) -> list[tuple[int, int]]:
        """(start, size) of this epoch's global batches at ``world`` ranks: the fixed ones, or an adaptive batch's from
        where the job is (cut by the same rule)."""
        first, sizes = (
            (0, self._sizes)
            if self.adaptive is None
            else (self.offset, _batches(self.length - self.offset, self.adaptive.batch(world)))
        )
        starts = (first + np.cumsum([0, *sizes[:-1]])).tolist() if sizes else []
        return list(zip(starts, sizes))

    def _plan(self, rank: int, world: int) -> list[_Step]:
        """The rest of this epoch's global batches, and this rank's micro-batches of each."""
        steps = []
        for start, size in self._sizes_from(world):
            if start >= self.offset:
                lo, hi = shares(size, world)[rank]
                largest = -(-size // world)
                count = -(-largest // self.micro_batch) if self.micro_batch else 1
                if hi > lo:
                    fetches = tuple(
                        (start + a, start + b, (b - a) * world / size) for a, b in pieces(lo, hi, count) if b > a
                    )
                else:
                    fetches = ((start, start, 0.0),)  # more ranks than samples: an empty share, kept in step at scale 0
                steps.append(_Step(start, size, fetches))
        return steps

    def __iter__(self) -> Iterator[Batch]:
        """The rest of the current epoch, a global batch per step; at its end the next epoch begins (``epoch`` + 1).

        Under the torch runtime each step begins at a boundary where the job's group may re-form in place
        (:mod:`pilotfill.elastic.torch.inplace`): the rest of the epoch is then planned for the ranks there are."""
        membership = inplace.active()
        formed = False
        while True:
            if membership is not None and not formed:
                membership.boundary()  # a joiner takes the job's state (and position) here, before planning
            formed = False
            rank, world = self._world()
            if world > self.global_batch and not self._warned:
                self._warned = True
                warnings.warn(
                    f"ElasticLoader: {world} ranks for a global batch of {self.global_batch}: "
                    f"{world - self.global_batch} of them idle each step (elastic_app(global_batch=…) keeps the "
                    "allocator below)",
                    stacklevel=2,
                )
            steps = self._plan(rank, world)
            if not steps:
                break
            self._sampler.order, self._sampler.steps = self._order(self.epoch), steps
            fetched = iter(self._loader)
            # outside pilotfill: nobody to tell
            reporting = self.report and rank == 0 and bool(os.environ.get("PILOTFILL_JOB_ID"))
            # alone and in no group: nothing changes
            watch = self._world if self._world is not current_world or world > 1 or _grouped() else None
            for i, step in enumerate(steps):
                if i and membership is not None and membership.boundary():
                    formed = True
                    break  # the group re-formed at this step: plan the rest of the epoch for the new one
                if watch is not None and watch() != (rank, world):
                    # the group changed under this epoch (Horovod's in-place reset): plan the rest for the new one
                    break
                micro = []
                for start, end, scale in step.fetches:
                    got = next(fetched)
                    if end == start and not self._sampler.empty_fetch:
                        got = _none_of(got)
                    micro.append(Micro(got, scale, tuple(self._sampler.order[start:end].tolist())))
                self.offset = step.start + step.size  # handed out: a commit from here on resumes after it
                factor = self._scale_lr(step.size)
                if reporting:
                    measured = {"noise_scale": self.noise.noise_scale} if self.adaptive is not None else {}
                    report(samples=step.size, position=self.position, **measured)
                yield Batch(
                    self.epoch,
                    step.start,
                    step.size,
                    step.start // self.global_batch,
                    rank,
                    world,
                    tuple(micro),
                    factor,
                    self._measure if self._local_sq is not None and world > 1 else None,
                )
            else:
                break
        self.epoch, self.offset = self.epoch + 1, 0
