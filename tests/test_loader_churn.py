"""What a job learns does not depend on what the machine did (issue 55): the same digits MLP, trained

(a) on one rank, (b) on four ranks held still, (c) under the torch runtime on the local cluster while the main
workload takes and gives back its nodes — single nodes preempted, the whole job preempted, a rank killed — and
(d) the same under Elastic Horovod, ends with the same parameters (to the all-reduce's order of addition) and the same
validation accuracy; and every rank's fetches from the training set show each sample trained once per epoch, the
samples done again after each stop exactly those after its last commit, as many as the controller counted redone.

The test plays the main workload (it signals the pilots, as a batch system preempts) at positions it chooses: the
job waits at a gate (``tests/gated_digits.py``) until the test has seen it there on the nodes it expects, so nothing
depends on how fast a busy machine is. Waiting changes when the job learns, not what.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch
from gated_digits import open_gate
from gloo_ranks import run_ranks
from localrun import SCRIPTED, LocalRun
from test_loader_ranks import max_relative_difference
from waiting import wait_for

from pilotfill.elastic.loader import ElasticLoader, shares
from pilotfill.reasons import StopCause

pytestmark = pytest.mark.local

HERE = Path(__file__).resolve().parent
RANKS_S = 600.0
"""A limit for anything that waits on ranks (importing torch, forming the group, Horovod's rendezvous): generous, for
a busy machine; nothing waits for it when things go well."""
N, B, EPOCHS, COMMIT_EVERY = 1347, 64, 15, 4
TRAINING = {"epochs": EPOCHS, "batch": B, "lr": 0.05, "depth": 2, "width": 64, "activation": "relu", "seed": 0}
SIZES = [B] * (N // B - 1) + [B + N % B]  # an epoch's global batches: the rest of the order joins the last
STARTS = [sum(SIZES[:k]) for k in range(len(SIZES))]
TOLERANCE = 1e-4


def reference(checkpoint: str, result: str, **training) -> None:
    """A ``gloo_ranks`` entry: digits on plain ranks held still, its last commit at ``checkpoint``."""
    from pilotfill.workloads import digits

    os.environ["PILOTFILL_RUNTIME"] = "torch"
    os.environ["PILOTFILL_CHECKPOINT"] = checkpoint
    out = digits.train(durable=True, **training)
    if int(os.environ["RANK"]) == 0:
        Path(result).write_text(json.dumps(out))


@pytest.fixture(scope="module")
def held_still(tmp_path_factory) -> dict[int, tuple[dict, float]]:
    """(a) one rank and (b) four ranks held still: their final parameters and validation accuracy."""
    out = {}
    for world in (1, 4):
        where = tmp_path_factory.mktemp(f"still{world}")
        (where / "ckpt").mkdir(mode=0o700)
        assert run_ranks("test_loader_churn:reference", world, where / "rdzv", checkpoint=str(where / "ckpt" / "job.pt"), result=str(where / "r.json"),
                         **TRAINING) == [0] * world  # fmt: skip
        params = torch.load(where / "ckpt" / "job.pt", weights_only=False)["model"]
        out[world] = (params, json.loads((where / "r.json").read_text())["val_accuracy"])
    return out


def _lines(record: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in record.read_text().splitlines() if line.endswith("}")]
    except FileNotFoundError:
        return []


def _ahead(position: int, steps: int) -> int:
    """``steps`` global batches past ``position``, moved into the next epoch if it would end one: a gate mid-epoch."""
    epoch, offset = divmod(position, N)
    offset += steps * B
    if offset >= STARTS[-1]:
        epoch, offset = epoch + 1, 2 * B
    return epoch * N + offset


class Churn:
    """The job, its gate and record, and the main workload's moves on the local cluster."""

    def __init__(self, run: LocalRun, tmp_path: Path):
        self.run, self.gate, self.record = run, tmp_path / "gate", tmp_path / "record.jsonl"
        self.position, self.since = _ahead(0, 5), 0.0
        self.actions: list[dict] = []
        open_gate(self.gate, self.position)
        spec = {"name": "digits", "entry": "gated_digits:train", "kwargs": {**TRAINING, "gate": str(self.gate), "record": str(self.record)},
                "min_nodes": 1, "max_nodes": 4, "global_batch": B, "curve": {"nodes": [0, 1, 2, 3, 4], "samples_per_s": [0, 1000, 2000, 3000, 4000]},
                "scale_up_cost_s": 1.0, "scale_down_cost_s": 1.0, "restart_cost_s": 1.0, "costs_known": True}  # every node it can have, at once  # fmt: skip
        self.job = run.client.submit(spec)

    def waiting(self) -> list[dict]:
        """The ranks waiting at the gate now: those that reached it since the last move and the job's last change
        (ranks of a group a move broke up can take a step or two before they are gone)."""
        changed = max((e["time"] for kind in ("job.started", "job.resized") for e in self.run.events(kind) if e["job"] == self.job), default=0.0)
        after = max(self.since, changed)
        return [r for r in _lines(self.record) if r["event"] == "gate" and r["time"] > after and r["position"] >= self.position]

    def group(self, world: int | None = None) -> list[dict]:
        """Every rank of one group of ``world`` ranks (the largest waiting, if None) waiting at the gate, or []."""
        waiting = self.waiting()
        world = world or max((r["world"] for r in waiting), default=0)
        latest = {r["rank"]: r for r in sorted(waiting, key=lambda r: r["time"]) if r["world"] == world}
        return list(latest.values()) if world and len(latest) == world else []

    def at_gate(self, world: int | None = None) -> list[dict]:
        """Open the gate at ``self.position`` and wait until a whole group of ``world`` ranks (any, if None) waits
        there. A smaller group on as many nodes (Elastic Horovod takes a new host in at a commit) is let on a commit
        interval at a time."""
        while True:
            open_gate(self.gate, self.position)
            self.run.wait_for(self.waiting, RANKS_S, f"the job's ranks at position {self.position}")
            if world is None:
                return self.run.wait_for(self.group, RANKS_S, f"a whole group at position {self.position}")
            held = {"since": None}

            def stuck() -> bool:  # on `world` nodes a while, yet a smaller group waits: it needs a commit to grow
                if len(self.run.client.job(self.job)["nodes"]) != world:
                    held["since"] = None
                    return False
                held["since"] = held["since"] or time.time()
                return time.time() - held["since"] > 15.0

            self.run.wait_for(lambda: (self.group(world) and len(self.run.client.job(self.job)["nodes"]) == world) or stuck(), RANKS_S,
                              f"{world} ranks at position {self.position}")  # fmt: skip
            if self.group(world) and len(self.run.client.job(self.job)["nodes"]) == world:
                return self.group(world)
            self.position = _ahead(self.position, COMMIT_EVERY)

    def move(self, kind: str, ranks: list[dict]) -> None:
        """One move of the main workload while the ranks wait at the gate; the gate then opens a few steps further."""
        job = self.run.client.job(self.job)
        pilots = {n: p for p in self.run.client.snapshot()["pilots"] if p["state"] == "running" for n in p["nodes"]}
        if kind == "preempt":  # the batch system takes one node back: its pilot gets SIGTERM and the grace
            os.kill(pilots[job["nodes"][-1]]["pid"], signal.SIGTERM)
        elif kind == "preempt all":  # every node of the job at once: the job stops, and resumes when nodes come back
            for node in job["nodes"]:
                os.kill(pilots[node]["pid"], signal.SIGTERM)
        elif kind == "kill rank":  # a hard stop: a rank dies without a word, mid-epoch
            os.kill(next(r["pid"] for r in ranks if r["rank"] == max(r["rank"] for r in ranks)), signal.SIGKILL)
        epoch, offset = divmod(self.position, N)
        self.actions.append({"kind": kind, "epoch": epoch, "offset": offset, "nodes": len(job["nodes"])})
        self.since = time.time()
        self.position = _ahead(self.position, 3 + len(self.actions) % 4)


def _train_under_churn(run: LocalRun, tmp_path: Path) -> tuple[Churn, dict]:
    run.start()
    churn = Churn(run, tmp_path)
    ranks = churn.at_gate(4)
    for kind in ["preempt", "preempt", "preempt all", "preempt", "kill rank", "preempt", "preempt all", "preempt"]:
        churn.move(kind, ranks)
        ranks = churn.at_gate(4 if kind != "kill rank" else None)
    open_gate(churn.gate, 10 * EPOCHS * N)
    done = run.client.wait([churn.job], timeout_s=RANKS_S)[churn.job]
    assert done["status"] == "finished", done.get("error")
    return churn, run.client.job(churn.job)


def _fetches(record: Path) -> list[tuple[dict, tuple[int, int]]]:
    """Every fetch of the training set, with the global batch (epoch, step) it is a rank's share of — by the split's
    own rule: contiguous shares of the epoch's order, by rank. A fetch that is no rank's share of any batch fails."""
    order = ElasticLoader(torch.zeros(N, 1), B, seed=TRAINING["seed"], report=False)
    plan = {}
    for epoch in range(EPOCHS):
        perm = order.order(epoch).tolist()
        for step, (start, size) in enumerate(zip(STARTS, SIZES)):
            for world in range(1, 5):
                for rank, (lo, hi) in enumerate(shares(size, world)):
                    plan[(world, rank, tuple(perm[start + lo : start + hi]))] = (epoch, step)
    out = []
    for r in _lines(record):
        if r["event"] == "fetch":
            key = (r["world"], r["rank"], tuple(r["indices"]))
            assert key in plan, f"rank {r['rank']} of {r['world']} was given {len(r['indices'])} samples that are no share of any global batch"
            out.append((r, plan[key]))
    return out


def _check_exactly_once(record: Path, job: dict) -> int:
    """Each epoch trains every sample once; what was done again after a stop starts at a commit; the controller
    counted it. Returns the samples redone."""
    fetches = _fetches(record)
    by_batch: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for r, batch in fetches:
        by_batch[batch].append(r)
    assert set(by_batch) == {(e, s) for e in range(EPOCHS) for s in range(len(SIZES))}, "a global batch was never trained"
    for (epoch, step), seen in by_batch.items():
        last = max((r for r in seen if r["rank"] == 0), key=lambda r: r["time"])
        final = {r["rank"]: r for r in seen if r["world"] == last["world"] and r["time"] >= last["time"] - 60}
        final = {rank: max((r for r in seen if r["world"] == last["world"] and r["rank"] == rank), key=lambda r: r["time"]) for rank in final}
        trained = Counter(i for r in final.values() for i in r["indices"])
        assert len(final) == last["world"] and sum(trained.values()) == SIZES[step] and max(trained.values()) == 1, (epoch, step)
    per_epoch = defaultdict(set)
    for (epoch, _), seen in by_batch.items():
        per_epoch[epoch] |= {i for r in seen for i in r["indices"]}
    assert all(per_epoch[e] == set(range(N)) for e in range(EPOCHS))
    # Done again only after a stop, from a commit: a process's fetches follow one another, except where it (or its
    # first fetch) resumes, and that is at a commit (every COMMIT_EVERY steps and at each epoch's end) — or it joins a
    # group in place (the torch runtime's resizes): processes that went on from the batch before (survivors) went on
    # to the same one, the joiner taking the state from them.
    order: dict[int, list[int]] = defaultdict(list)
    for r, (epoch, step) in fetches:
        order[r["pid"]].append(epoch * len(SIZES) + step)
    went_on = {(a, b) for ats in order.values() for a, b in zip(ats, ats[1:]) if b == a + 1}
    # A job all of whose ranks leave at a boundary commits there first (in place): it resumes at the next batch,
    # redoing none.
    last_of: dict[int, int] = {}
    fetched: set[tuple[int, int]] = set()  # (batch, rank)
    for r, (epoch, step) in fetches:
        at = epoch * len(SIZES) + step
        if last_of.get(r["pid"]) != at - 1:
            joined = at > 0 and (at - 1, at) in went_on
            assert step % COMMIT_EVERY == 0 or joined or (at, r["rank"]) not in fetched, (
                f"a resume at step {step} of epoch {epoch}: not a commit, nor a join of a group going on, and redoing a batch")
        last_of[r["pid"]] = at
        fetched.add((at, r["rank"]))
    attempts = Counter(batch for r, batch in fetches if r["rank"] == 0)
    redone = sum((n - 1) * SIZES[step] for (_, step), n in attempts.items())
    assert job["progress"] == job["committed"] == EPOCHS * N
    assert job["redone"] == redone, f"the controller counted {job['redone']} samples redone; the ranks' fetches say {redone}"
    print(f"{sum(attempts.values()) - len(attempts)} global batches done twice, {redone:.0f} samples redone: as the controller counted")
    return redone


def _check_same_model(run: LocalRun, churn: Churn, job: dict, held_still: dict, label: str) -> None:
    params = torch.load(run.run_dir / "checkpoints" / f"{churn.job}.pt", weights_only=False)["model"]
    one, accuracy = held_still[1]
    differences = {name: max_relative_difference(p, one) for name, (p, _) in [(label, (params, None)), ("4 ranks held still", held_still[4])]}
    print(f"\n{label}: max relative difference of the parameters to one rank's: " + ", ".join(f"{k} {v:.2e}" for k, v in differences.items()))
    assert all(d <= TOLERANCE for d in differences.values()), differences
    assert f"{job['result']['val_accuracy']:.3f}" == f"{accuracy:.3f}" == f"{held_still[4][1]:.3f}"


def _check_churned(run: LocalRun, churn: Churn) -> None:
    resized = [e for e in run.events("job.resized") if e["data"]["before"] > 0 and e["data"]["after"] > 0]
    stopped = [e for e in run.events("job.stopped") if e["data"].get("cause") != StopCause.ALLOCATION]
    assert len(resized) >= 10, f"{len(resized)} resizes"
    assert len(stopped) >= 2, f"{len(stopped)} preemptions of the whole job"
    assert all(0 < a["offset"] < N for a in churn.actions), "every move mid-epoch"
    assert run.client.job(churn.job)["spec"]["global_batch"] == B
    print(f"\n{len(resized)} resizes, {len(stopped)} stops of the whole job; moves: " + ", ".join(f"{a['kind']} at epoch {a['epoch']} sample {a['offset']}" for a in churn.actions))


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))  # gated_digits
    runs: list[LocalRun] = []

    def make(runtime: str) -> LocalRun:
        # A Horovod rank whose peer left can wait out Gloo's timeout in its collective: 45 s, not the default 120 s.
        config = SCRIPTED.format(nodes=4, workload="none", script="", deadline=3.0, grace=3.0, runtime=runtime, runtime_options="") + "collective_timeout_s = 45.0\n"
        runs.append(LocalRun(tmp_path, config=config))
        return runs[-1]

    yield make
    for run in runs:
        run.stop()
        run.wait_for(lambda: not run.leftover_processes(), 30, "no leftover processes")


def test_torch_runtime_under_churn_learns_what_one_rank_learns(cluster, tmp_path, held_still, torch_runtime):
    run = cluster("torch")
    churn, job = _train_under_churn(run, tmp_path)
    _check_churned(run, churn)
    redone = _check_exactly_once(churn.record, job)
    assert redone > 0
    _check_same_model(run, churn, job, held_still, "torch runtime under churn")


def test_horovod_under_churn_learns_what_one_rank_learns(cluster, tmp_path, held_still, horovod):
    run = cluster("horovod")
    churn, job = _train_under_churn(run, tmp_path)
    _check_churned(run, churn)
    redone = _check_exactly_once(churn.record, job)
    assert redone > 0
    _check_same_model(run, churn, job, held_still, "Elastic Horovod under churn")
