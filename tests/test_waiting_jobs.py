"""The waiting jobs a decision admits, kinds and worth described once per change (controller/waiting.py), on a real
World over a real SQLite journal."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pilotfill.controller.waiting import WaitingJobs, admit, in_turns, most_promising
from pilotfill.controller.world import World
from pilotfill.journal import Journal

pytestmark = pytest.mark.unit


def admitted_by_the_loop(lo: list[int], room: int | None, limit: int, running: int) -> list[int]:
    """The rule as the loop over open jobs wrote it before it was one array operation."""
    out, need, count = [], 0, running
    for i, n in enumerate(lo):
        if limit and count >= limit:
            break
        if room is not None:
            if n > room:
                continue
            if not limit and need + n > room:
                break
        need += n
        out.append(i)
        count += 1
    return out


@pytest.mark.parametrize("seed", range(40))
def test_admission_is_the_rule_of_submission_order_within_the_room_or_the_limit(seed):
    rng = random.Random(seed)
    lo = [rng.choice([1, 1, 2, 4, 8, 64]) for _ in range(rng.randint(0, 60))]
    room = rng.choice([None, 0, 3, 17, 100, 10_000])
    limit = rng.choice([0, 0, 5, 10])
    running = rng.randint(0, 12)
    assert admit(np.array(lo, dtype=np.int64), room, limit, running).tolist() == admitted_by_the_loop(lo, room, limit, running)


class Described:
    """Kind and worth functions that count their calls; a job's kind is its min_nodes, its worth its number and version."""

    def __init__(self):
        self.calls: list[str] = []
        self.valued: list[str] = []
        self.versions: dict[str, int] = {}
        self.asked: list[str] = []

    def __call__(self, job) -> int:
        self.calls.append(job.id)
        return job.spec["min_nodes"]

    def worth(self, job) -> tuple[float, float]:
        self.valued.append(job.id)
        return (float(job.seq % 7), float(self.versions.get(job.id, 0)))

    def version(self, job) -> int:
        return self.versions.get(job.id, 0)

    def traits(self, job) -> tuple[bool, float] | None:
        self.asked.append(job.id)
        return None if job.spec.get("broken") else (job.seq % 2 == 0, float(job.seq + self.versions.get(job.id, 0)))

    def waiting(self) -> WaitingJobs:
        return WaitingJobs(self, self.worth, self.version, self.traits)


def test_waiting_jobs_are_described_again_only_when_they_or_their_curves_change_and_admitted_as_the_world_admits(tmp_path):
    (tmp_path / "run").mkdir()
    world = World(Journal(tmp_path / "run"))
    described = Described()
    waiting = described.waiting()
    rng = random.Random(3)
    jobs = [world.add_job(f"j{i}", "sweep", {"min_nodes": rng.choice([1, 2, 4])}, 0.0) for i in range(40)]

    def check(rooms=(None, 0, 5, 30, 1000)):
        for room in rooms:
            for limit in (0, 12):
                got = waiting.admitted(room, limit, len(world.running))
                expected = [j for j in world.active_jobs(limit, room) if j.status != "running"]
                assert [j.id for j in got.jobs] == [j.id for j in expected]
                assert got.kinds.tolist() == [j.spec["min_nodes"] for j in expected]

    waiting.sync(world, world.take_changed(), recheck=False)
    assert sorted(described.calls) == sorted(j.id for j in jobs)
    check()

    described.calls.clear()
    waiting.sync(world, world.take_changed(), recheck=True)
    assert described.calls == []  # nothing changed: nothing described

    for job in jobs[3:9]:
        world.update_job(job, status="running", nodes=[f"n{job.seq}"])
    world.update_job(jobs[20], status="failed", nodes=[])
    waiting.sync(world, world.take_changed(), recheck=False)
    assert sorted(described.calls) == []  # started or ended: only left the queue
    check()

    world.add_progress(jobs[4], 10.0)  # a running job's reports change nothing here
    world.requeue(jobs[4])  # stopped: waits again, with its progress
    jobs[30].spec = {"min_nodes": 8}
    world.set_spec(jobs[30], jobs[30].spec)
    waiting.sync(world, world.take_changed(), recheck=False)
    assert sorted(described.calls) == ["j30", "j4"]
    check()

    described.calls.clear()
    described.versions["j11"] = 1  # JPA's curves of one waiting job moved
    waiting.sync(world, world.take_changed(), recheck=False)
    assert described.calls == []  # not asked to look
    waiting.sync(world, world.take_changed(), recheck=True)
    assert described.calls == ["j11"]
    assert waiting.kind(jobs[11]) == jobs[11].spec["min_nodes"]
    assert waiting.kind(jobs[5]) is None  # running: not waiting
    check()


def test_the_most_promising_rank_first_earlier_submissions_first_among_equals():
    worth = np.array([(1.0, 1.0), (2.0, 0.0), (1.0, 3.0), (2.0, 0.0), (0.0, 9.0), (np.inf, np.inf)])
    assert most_promising(np.array([1, 2, 3, 4, 5, 6]), worth).tolist() == [6, 2, 4, 3, 1, 5]


def test_admission_by_groups_takes_them_in_turns_besides_those_in_order_not_one_groups_backlog():
    lo = np.array([1, 1, 1, 1, 1, 1, 1, 1])
    groups = ["a"] * 6 + ["b", "b"]  # a's backlog, then b's two jobs
    assert admit(lo, 4, 0, 0).tolist() == [0, 1, 2, 3]
    # In submission order: the four that order admits, and the two of each group in turns (b's two among them).
    assert admit(lo, 4, 0, 0, groups).tolist() == [0, 1, 2, 3, 6, 7]
    # min_nodes still fit the room, each way: in order 0 and 1, in turns 0 and 2.
    assert admit(np.array([3, 1, 1, 1]), 4, 0, 0, ["a", "a", "b", "b"]).tolist() == [0, 1, 2]
    assert admit(lo, None, 3, 0, groups).tolist() == [0, 1, 6]  # a limit: the first three in turns


def test_in_turns_takes_every_groups_first_then_every_groups_second():
    groups = ["fast", "fast", "fast", "slow", "fast", "slow", "mid"]
    order = in_turns(groups).tolist()
    assert order == [0, 3, 6, 1, 5, 2, 4]  # each group's first (in the order given), then each one's second, ...
    assert [groups[i] for i in order[:3]] == ["fast", "slow", "mid"]
    assert in_turns([]).tolist() == []


def _synced_queue(tmp_path, n: int):
    """A world of ``n`` waiting one-node jobs and a queue that has taken them in: (world, described, waiting, jobs)."""
    (tmp_path / "run").mkdir()
    world = World(Journal(tmp_path / "run"))
    described = Described()
    waiting = described.waiting()
    jobs = [world.add_job(f"j{i}", "sweep", {"min_nodes": 1}, 0.0) for i in range(n)]
    waiting.sync(world, world.take_changed(), recheck=False)
    return world, described, waiting, jobs


def test_a_waiting_job_is_valued_when_a_decision_first_ranks_it_and_again_only_after_it_changes(tmp_path):
    """A campaign of a thousand jobs submitted at once is not valued in one pass: a job's worth is made when a decision
    ranks it, kept until it changes."""
    world, described, waiting, jobs = _synced_queue(tmp_path, 50)
    assert described.valued == []
    admitted = waiting.admitted(None, 0, 0)
    at = np.arange(10, 20)
    order = waiting.most_promising(admitted, at)
    assert sorted(described.valued) == sorted(f"j{i}" for i in range(10, 20))
    assert order.tolist() == sorted(range(10, 20), key=lambda i: (-(jobs[i].seq % 7), i))
    described.valued.clear()
    waiting.most_promising(waiting.admitted(None, 0, 0), np.arange(0, 20))
    assert sorted(described.valued) == sorted(f"j{i}" for i in range(10))  # the others were valued already
    described.valued.clear()
    described.versions["j12"] = 5
    world.update_job(jobs[15], status="pending")  # a change of its own
    waiting.sync(world, world.take_changed(), recheck=True)
    waiting.most_promising(waiting.admitted(None, 0, 0), np.arange(0, 20))
    assert sorted(described.valued) == ["j12", "j15"]


def test_what_the_pilots_question_asks_of_a_waiting_job_is_made_when_first_asked_and_again_only_after_it_changes(tmp_path):
    """The pilots' question on a saturated machine asks thousands of waiting jobs whether one node alone would serve
    them and what a rescale of them costs, in every pass: the answers are kept until the job (or JPA's curves of it)
    changes. A job that is not waiting is asked anew each time; a job the allocator cannot use says None."""
    world, described, waiting, jobs = _synced_queue(tmp_path, 30)
    assert described.asked == []  # not made until asked
    first = [waiting.traits(job) for job in jobs]
    assert first == [(job.seq % 2 == 0, float(job.seq)) for job in jobs]
    assert sorted(described.asked) == sorted(job.id for job in jobs)
    described.asked.clear()
    assert [waiting.traits(job) for job in jobs] == first
    assert described.asked == []  # kept
    described.versions["j3"] = 10  # JPA's curves of j3 moved
    jobs[7].spec = {"min_nodes": 1, "broken": True}
    world.set_spec(jobs[7], jobs[7].spec)
    world.update_job(jobs[9], status="running", nodes=["n1"])
    waiting.sync(world, world.take_changed(), recheck=True)
    assert waiting.traits(jobs[3]) == (jobs[3].seq % 2 == 0, float(jobs[3].seq + 10))
    assert waiting.traits(jobs[7]) is None
    waiting.traits(jobs[9])
    waiting.traits(jobs[9])
    assert [waiting.traits(job) for job in jobs[10:]] == first[10:]
    assert sorted(described.asked) == ["j3", "j7", "j9", "j9"]  # the changed ones once; the running one each time


@pytest.mark.parametrize("seed", range(6))
def test_the_rows_stay_the_queue_in_submission_order_through_any_sequence_of_changes(tmp_path, seed):
    """Jobs start, stop with progress, end, arrive, change spec — a few at a time (rows inserted and deleted) or many
    (made again): after each sync the admitted jobs are those the world's own rule admits, with their descriptions."""
    (tmp_path / "run").mkdir()
    world = World(Journal(tmp_path / "run"))
    described = Described()
    waiting = described.waiting()
    rng = random.Random(seed)
    count = 0

    def add(n):
        nonlocal count
        for _ in range(n):
            world.add_job(f"j{count}", "sweep", {"min_nodes": rng.choice([1, 2, 3, 8])}, 0.0)
            count += 1

    add(30)
    for step in range(120):
        for _ in range(rng.choice([1, 1, 2, 3, 40])):  # now and then a wave
            open_jobs = list(world.open.values())
            what = rng.random()
            if what < 0.1 or not open_jobs:
                add(rng.choice([1, 25]))
                continue
            job = rng.choice(open_jobs)
            if what < 0.4 and job.status != "running":
                world.update_job(job, status="running", nodes=[f"n{job.seq}"])
            elif what < 0.6 and job.status == "running":
                world.requeue(job)
            elif what < 0.7:
                world.update_job(job, status="finished", nodes=[])
            elif what < 0.85:
                world.set_spec(job, {"min_nodes": rng.choice([1, 2, 5])})
            else:
                described.versions[job.id] = described.versions.get(job.id, 0) + 1
        waiting.sync(world, world.take_changed(), recheck=True)
        room = rng.choice([None, 0, 4, 20, 500])
        limit = rng.choice([0, 0, 7])
        got = waiting.admitted(room, limit, len(world.running))
        expected = [j for j in world.active_jobs(limit, room) if j.status != "running"]
        assert [j.id for j in got.jobs] == [j.id for j in expected], step
        assert got.kinds.tolist() == [j.spec["min_nodes"] for j in expected]
        everyone = np.arange(len(got.jobs))
        ranked = waiting.most_promising(got, everyone)
        worth = [(float(j.seq % 7), float(described.versions.get(j.id, 0))) for j in got.jobs]
        assert ranked.tolist() == sorted(everyone.tolist(), key=lambda i: (-worth[i][0], -worth[i][1], i))
