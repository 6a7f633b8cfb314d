"""``ElasticLoader`` in one process: the split, the scale, the position, the commit (issue 55).

Ranks are simulated in step here — one loader per rank, each told its (rank, world), gradients averaged as DDP and
Horovod average them — so the arithmetic is checked exactly and fast; real ranks are ``test_loader_ranks.py``.
"""

from __future__ import annotations

import copy
import sys
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from pilotfill.elastic.loader import GLOBAL_BATCH_ENV, ElasticLoader, pieces, shares

pytestmark = pytest.mark.unit


def _data(n: int = 103, features: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, features, generator=g), torch.randint(0, 3, (n,), generator=g)


def _loaders(data, world: int, saved: dict | None = None, **kw) -> list[ElasticLoader]:
    loaders = []
    for rank in range(world):
        loader = ElasticLoader(data, report=False, world=lambda rank=rank: (rank, world), **kw)
        if saved is not None:
            loader.load_state_dict(saved)
        loaders.append(loader)
    return loaders


def _steps(loaders: list[ElasticLoader], count: int | None = None):
    """Up to ``count`` steps of every rank in step (the rest of the epoch without): lists of each rank's batch."""
    iters = [iter(loader) for loader in loaders]
    out = []
    while count is None or len(out) < count:
        try:
            out.append([next(it) for it in iters])
        except StopIteration:
            break
    return out


def test_shares_are_contiguous_by_rank_and_differ_by_at_most_one():
    for size in range(1, 40):
        for world in range(1, 9):
            parts = shares(size, world)
            assert parts[0][0] == 0 and parts[-1][1] == size
            assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
            lengths = [e - s for s, e in parts]
            assert max(lengths) - min(lengths) <= 1 and lengths == sorted(lengths, reverse=True)


def test_micro_batches_put_empty_ones_first_so_the_last_one_synchronises():
    assert pieces(10, 17, 3) == [(10, 12), (12, 14), (14, 17)]
    assert pieces(0, 2, 3) == [(0, 0), (0, 1), (1, 2)]


@pytest.mark.parametrize("worlds", [(1, 2), (4, 1), (3, 4, 2, 1, 3), (2, 5, 5, 1)])
def test_every_sample_once_per_epoch_whatever_the_world_does(worlds):
    """The world changes after a few steps each time (at a commit); every epoch still trains each sample once."""
    data, batch = _data(103), 8
    saved, seen, global_batches, i = None, Counter(), [], 0
    while saved is None or saved["epoch"] < 3:
        world = worlds[i % len(worlds)]
        i += 1
        loaders = _loaders(data, world, saved, global_batch=batch, seed=5)
        for step in _steps(loaders, count=2 + i % 3):
            assert len({(b.epoch, b.start, b.size) for b in step}) == 1  # every rank in the same global batch
            together = [i for b in step for i in b.indices]
            assert len(together) == step[0].size and len(set(together)) == len(together)
            seen.update((step[0].epoch, i) for i in together)
            global_batches.append(step[0].size)
        saved = loaders[0].state_dict()
    for epoch in range(3):
        assert sorted(i for (e, i), n in seen.items() if e == epoch and n == 1) == list(range(103)), f"epoch {epoch}"
    assert all(n == 1 for n in seen.values()) and i > len(worlds)
    assert set(global_batches) == {8, 8 + 103 % 8}  # the rest of the order joins the epoch's last batch


def test_the_order_depends_on_the_seed_and_epoch_only():
    data = _data(50)
    a, b = ElasticLoader(data, 10, seed=3, report=False), ElasticLoader(data, 10, seed=3, report=False, world=lambda: (1, 4))
    assert torch.equal(a.order(2), b.order(2)) and not torch.equal(a.order(1), a.order(2))
    assert not torch.equal(a.order(0), ElasticLoader(data, 10, seed=4, report=False).order(0))


@pytest.mark.parametrize(("world", "micro"), [(1, None), (2, None), (3, 4), (5, None), (4, 1)])
def test_the_scaled_gradient_is_the_mean_over_the_global_batch_on_any_world_size(world, micro):
    """Each rank's ``backward`` on its share, averaged over the world as DDP and Horovod do, is the gradient of the
    mean loss over the whole global batch: exactly, whatever the split and the micro-batches."""
    data = _data(64)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    steps = _steps(_loaders(data, world, global_batch=13, micro_batch=micro), count=2)
    for step in steps:
        grads = []
        for batch in step:
            replica = copy.deepcopy(model)
            batch.backward(lambda x, y: F.cross_entropy(replica(x), y), replica)
            grads.append([p.grad for p in replica.parameters()])
            if micro is not None:  # at most micro samples forwarded at once, never more micro-batches than the largest share needs
                assert all(len(m.indices) <= micro for m in batch.micro) and len(batch.micro) <= -(-(-(-13 // world)) // micro)
        averaged = [sum(g[i] for g in grads) / world for i in range(len(grads[0]))]
        idx = torch.tensor([i for b in step for i in b.indices])
        whole = copy.deepcopy(model)
        F.cross_entropy(whole(data[0][idx]), data[1][idx]).backward()
        for got, want in zip(averaged, (p.grad for p in whole.parameters())):
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-7)


def test_micro_batches_need_the_model_to_accumulate_before_the_all_reduce():
    (step,) = _steps(_loaders(_data(20), 1, global_batch=8, micro_batch=3), count=1)
    model = torch.nn.Linear(6, 3)
    with pytest.raises(ValueError, match="needs the model"):
        step[0].backward(lambda x, y: F.cross_entropy(model(x), y))


def test_more_ranks_than_samples_keep_the_idle_ones_in_step_with_nothing_learned():
    data = _data(3)
    with pytest.warns(UserWarning, match="5 ranks for a global batch of 3"):
        (step,) = _steps(_loaders(data, 5, global_batch=3), count=1)
    assert [len(b.indices) for b in step] == [1, 1, 1, 0, 0]
    idle = step[4]
    assert idle.micro[0].scale == 0.0 and idle.micro[0].data[0].shape == (0, 6)
    model = torch.nn.Linear(6, 3)
    assert float(idle.backward(lambda x, y: F.cross_entropy(model(x), y), model)) == 0.0
    assert all(float(p.grad.abs().sum()) == 0.0 for p in model.parameters())


def test_drop_last_leaves_the_rest_out_and_a_small_dataset_is_one_batch():
    data = _data(20)
    loader = ElasticLoader(data, 8, drop_last=True, report=False)
    assert [b.size for b in loader] == [8, 8] and loader.epoch == 1 and loader.epoch_samples == 16 and len(loader) == 2
    assert [b.size for b in ElasticLoader(data, 32, report=False)] == [20]


def test_the_position_counts_global_samples_and_a_state_dict_resumes_it():
    data = _data(30)
    loader = ElasticLoader(data, 7, report=False)
    it = iter(loader)
    next(it), next(it)
    assert (loader.epoch, loader.offset, loader.position) == (0, 14, 14)
    list(it)
    assert (loader.epoch, loader.offset, loader.position) == (1, 0, 30)
    other = ElasticLoader(data, 7, report=False, world=lambda: (1, 3))
    other.load_state_dict({**loader.state_dict(), "offset": 14})
    assert next(iter(other)).start == 14 and other.position == 51
    with pytest.raises(ValueError, match="seed=0"):
        ElasticLoader(data, 7, seed=1, report=False).load_state_dict(loader.state_dict())


def test_a_committed_position_is_restored_by_elastic_state(tmp_path):
    from pilotfill.elastic.state import ElasticState

    data, path = _data(40), tmp_path / "ckpt" / "job.pt"
    path.parent.mkdir(mode=0o700)
    model = torch.nn.Linear(6, 3)
    loader = ElasticLoader(data, 8, report=False)
    state = ElasticState(model, torch.optim.SGD(model.parameters(), lr=0.1), path=path, loader=loader, note="x")
    it = iter(loader)
    next(it), next(it)
    state.commit()
    next(it)
    again = ElasticLoader(data, 8, report=False, world=lambda: (0, 2))
    restored = ElasticState(torch.nn.Linear(6, 3), path=path, loader=again, note="")
    assert restored.restored and restored.loader is again and again.offset == 16 and restored.note == "x"
    assert torch.load(path, weights_only=False)["extra"]["loader"]["position"] == 16  # a plain dict in the commit


def test_rank_0_reports_each_global_batch_as_it_hands_it_out(monkeypatch):
    said: list[float] = []
    monkeypatch.setenv("PILOTFILL_JOB_ID", "j1")  # a rank of a job (outside one there is nobody to tell)
    monkeypatch.setattr(sys.modules["pilotfill.elastic.loader"], "report", lambda samples, position: said.append((samples, position)))
    data = _data(20)
    for rank in range(3):
        list(ElasticLoader(data, 6, world=lambda rank=rank: (rank, 3)))
    assert said == [(6, 6), (6, 12), (8, 20)]  # rank 0 only, each global batch and where the job is after it


def test_the_global_batch_is_the_apps_declaration_unless_the_loader_names_a_larger_one(monkeypatch):
    data = _data(20)
    monkeypatch.setenv(GLOBAL_BATCH_ENV, "5")
    assert ElasticLoader(data, report=False).global_batch == 5
    assert ElasticLoader(data, 10, report=False).global_batch == 10  # a sweep declares its smallest
    with pytest.raises(ValueError, match="smaller than the 5 the app declares"):
        ElasticLoader(data, 4, report=False)
    monkeypatch.delenv(GLOBAL_BATCH_ENV)
    with pytest.raises(ValueError, match="needs a global batch"):
        ElasticLoader(data)
    with pytest.raises(ValueError, match="batch_size"):
        ElasticLoader(data, 4, batch_size=3)


def test_a_dataset_with_workers_gives_the_same_batches():
    """Any map-style dataset through ``DataLoader`` workers: the same indices and data as tensors read in process."""
    x, y = _data(37)

    class Pairs(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(x)

        def __getitem__(self, i: int):
            return x[i], y[i]

    plain = [(b.indices, b.data) for b in ElasticLoader((x, y), 6, report=False, world=lambda: (1, 2))]
    workers = [(b.indices, b.data) for b in ElasticLoader(Pairs(), 6, report=False, world=lambda: (1, 2), num_workers=2)]
    assert [i for i, _ in plain] == [i for i, _ in workers]
    for (_, (xa, ya)), (_, (xb, yb)) in zip(plain, workers):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
