"""What real torch ranks train on: every sample once per epoch whatever the world size does (issue 55).

Each test runs gloo ranks as processes (``tests/gloo_ranks.py``) with nothing else of pilotfill, stops them right
after a commit and resumes the job on another number of ranks from that commit.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from gloo_ranks import run_ranks

pytestmark = pytest.mark.local

DIGITS_TRAIN = 1347  # scikit-learn's digits, 75 % of 1,797 (digits.data)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


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
