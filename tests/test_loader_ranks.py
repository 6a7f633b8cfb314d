"""What real torch ranks train on: every sample once per epoch whatever the world size does (issue 55).

Each test runs gloo ranks as processes (``tests/gloo_ranks.py``) with nothing else of pilotfill, stops them right
after a commit and resumes the job on another number of ranks from that commit.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from gloo_ranks import run_ranks

pytestmark = pytest.mark.local

DIGITS_TRAIN = 1347  # scikit-learn's digits, 75 % of 1,797 (digits.data)


def _records(path: Path) -> list[dict]:
    """What the ranks trained on (one line per forward), without rank 0's result line."""
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r for r in lines if "indices" in r]


def _parameters(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["model"]


def max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest difference between two models' parameters, relative to each tensor's largest magnitude."""
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max()) for k in b)


@pytest.mark.parametrize(("first", "stop_after", "then"), [(1, 7, 2), (4, 2, 1), (3, 3, 4)])
def test_digits_trains_every_sample_once_in_an_epoch_resumed_on_another_world_size(tmp_path, torch_runtime, first, stop_after, then):
    """The issue's replay, run for real: 28 steps on 1 rank then 2 ranks skipped 451 samples; 8 steps on 4 ranks then
    1 rank repeated hundreds. A commit every 4 steps: the stop after the k-th lands mid-epoch, nothing after it lost."""
    record, checkpoint = tmp_path / "seen.jsonl", tmp_path / "ckpt" / "job.pt"
    checkpoint.parent.mkdir(mode=0o700)
    assert run_ranks("digits_order:train", first, tmp_path / "rdzv1", record=str(record), checkpoint=str(checkpoint), stop_after=stop_after) == [0] * first
    before = sum(len(r["indices"]) for r in _records(record))
    assert 0 < before < DIGITS_TRAIN, "the first run should stop mid-epoch"
    assert run_ranks("digits_order:train", then, tmp_path / "rdzv2", record=str(record), checkpoint=str(checkpoint)) == [0] * then
    seen = Counter(i for r in _records(record) for i in r["indices"])
    never = sorted(set(range(DIGITS_TRAIN)) - set(seen))
    twice = sorted(i for i, n in seen.items() if n > 1)
    assert not never and not twice, f"{len(never)} samples never trained, {len(twice)} trained more than once"


def test_the_same_training_on_one_three_and_four_ranks_learns_the_same_model(tmp_path, torch_runtime):
    """A global batch of 32 for 3 epochs on 1 rank, on 3 ranks in micro-batches of 4 (11 samples each: 3 micro-batches,
    DDP's no_sync) and on 4 ranks: the parameters differ only by the all-reduce's order of addition."""
    runs = {}
    for world, micro in ((1, None), (3, 4), (4, None)):
        out = tmp_path / f"w{world}"
        (out / "ckpt").mkdir(parents=True, mode=0o700)
        record = out / "result.jsonl"
        assert run_ranks("digits_order:train", world, out / "rdzv", record=str(record), checkpoint=str(out / "ckpt" / "job.pt"), epochs=3,
                         micro_batch=micro) == [0] * world  # fmt: skip
        result = next(json.loads(line)["result"] for line in record.read_text().splitlines() if "result" in line)
        runs[world] = (_parameters(out / "ckpt" / "job.pt"), result["val_accuracy"])
    one, accuracy = runs[1]
    for world in (3, 4):
        assert max_relative_difference(runs[world][0], one) < 1e-5, world
        assert f"{runs[world][1]:.3f}" == f"{accuracy:.3f}"


HOROVOD_STATE = """
import json, sys
import horovod.torch as hvd
import torch
from pilotfill.elastic import ElasticLoader, TorchState

hvd.init()
path, phase = sys.argv[1], sys.argv[2]
model = torch.nn.Linear(4, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
loader = ElasticLoader((torch.randn(50, 4), torch.randint(0, 2, (50,))), global_batch=8, micro_batch=3, report=False)
state = TorchState(model, opt, path=path, loader=loader)
seen = {"restored": loader.offset}
if phase == "first":
    batches = iter(loader)
    for _ in range(3):
        opt.zero_grad()
        next(batches).backward(lambda x, y: torch.nn.functional.cross_entropy(model(x), y), model)  # micro-batches: no extra all-reduce
        opt.step()
    state.commit()
    next(batches), next(batches)
    seen["before_restore"] = loader.offset
    state.restore()  # what hvd.elastic.run does after a lost rank
    seen["after_restore"] = loader.offset
    state.sync()  # what it does for a joiner: rank 0's position to all
    seen["after_sync"] = loader.offset
print(json.dumps(seen))
"""


def test_horovod_state_commits_restores_syncs_and_saves_the_position(tmp_path, horovod):
    """Horovod's TorchState handles the loader as its own ElasticSampler (in memory), and pilotfill's writes its
    position with every commit, in the format ElasticState reads: the two runtimes resume each other's commits."""
    import subprocess
    import sys

    path = tmp_path / "ckpt" / "job.pt"
    path.parent.mkdir(mode=0o700)
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def phase(name: str) -> dict:
        out = subprocess.run([sys.executable, "-c", HOROVOD_STATE, str(path), name], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert phase("first") == {"restored": 0, "before_restore": 40, "after_restore": 24, "after_sync": 24}
    assert phase("again") == {"restored": 24}  # the durable commit, in a new process
    from pilotfill.elastic import ElasticLoader, ElasticState

    loader = ElasticLoader(torch.zeros(50, 4), global_batch=8, report=False)
    ElasticState(torch.nn.Linear(4, 2), path=path, loader=loader)
    assert loader.offset == 24
