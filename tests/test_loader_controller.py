"""What the controller does with an elastic loader's job (issue 55): it never gives it more ranks than its global batch
feeds (the declaration, its checks, the cap at submission, before the first report), and its progress is the loader's
position, its redone samples what the ranks did again — whatever the order of a stop and their reports."""

from __future__ import annotations

import os

import pytest
from test_controller_core import T0

from pilotfill.config import Config, ControllerConfig, NodeTypeConfig, PilotConfig, RuntimeConfig
from pilotfill.controller import Controller
from pilotfill.elastic.simulated import SimulatedRuntime
from pilotfill.executors.decorator import GLOBAL_BATCH_ENV, RESOURCE_KEY, ElasticAppError, elastic_app
from pilotfill.protocol import ProtocolError, check_spec
from pilotfill.schedulers.replay import ReplayScheduler
from pilotfill.traces import read_trace

pytestmark = pytest.mark.unit


def test_the_declaration_rides_in_the_spec_and_reaches_the_ranks_loader(monkeypatch):
    from pilotfill.elastic import loader

    assert GLOBAL_BATCH_ENV == loader.GLOBAL_BATCH_ENV  # the decorator does not import torch to say it

    @elastic_app(min_nodes=1, max_nodes=64, global_batch=256, min_per_rank=4)
    def train() -> str:
        return os.environ[GLOBAL_BATCH_ENV]

    spec = train.func.__signature__.parameters[RESOURCE_KEY].default
    assert (spec["global_batch"], spec["min_per_rank"]) == (256, 4)
    monkeypatch.setenv(GLOBAL_BATCH_ENV, "")  # so that what the call sets is undone after the test
    assert train.func(**{RESOURCE_KEY: spec}) == "256"  # what a rank runs: the loader finds the batch the job was sized for


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"global_batch": 0}, "global_batch must be an integer >= 1"),
    ({"global_batch": 8, "min_per_rank": 1.5}, "min_per_rank must be an integer >= 1"),
    ({"global_batch": 8, "min_per_rank": 4, "min_nodes": 3, "max_nodes": 4}, "feeds 2 rank(s) of min_per_rank=4 samples, fewer than min_nodes=3"),
])  # fmt: skip
def test_a_batch_that_cannot_feed_the_job_fails_at_import(kwargs, message):
    with pytest.raises(ElasticAppError, match=message.replace("(", r"\(").replace(")", r"\)")):
        elastic_app(**kwargs)


def test_check_spec_names_a_bad_batch():
    base = {"name": "j", "entry": "m:f", "min_nodes": 1, "max_nodes": 4}
    assert check_spec({**base, "global_batch": 32})["global_batch"] == 32
    with pytest.raises(ProtocolError, match="global_batch must be an integer"):
        check_spec({**base, "global_batch": "32"})
    with pytest.raises(ProtocolError, match="min_per_rank needs global_batch"):
        check_spec({**base, "min_per_rank": 2})


def _controller(tmp_path, write, ranks_per_node: int = 1, node_types: tuple = ()) -> Controller:
    trace = read_trace(write("trace.csv", "time,node,state\n" + "".join(f"{T0},n{i},idle\n" for i in range(64)) + "2021-02-10T01:00:00Z,,end\n"))
    config = Config(scheduler="replay", pilots=PilotConfig(heartbeat_s=3600.0, heartbeat_deadline_s=7200.0), controller=ControllerConfig(tick_s=1.0),
                    runtime=RuntimeConfig(ranks_per_node=ranks_per_node), node_types=node_types)  # fmt: skip
    return Controller(tmp_path / "run", config, scheduler=ReplayScheduler(trace, queue_delay_s=0.0), runtime=SimulatedRuntime({}, now=trace.start),
                      clock=lambda: trace.start)  # fmt: skip


def _submit(ctl: Controller, **spec) -> dict:
    reply = ctl.handle({"type": "job.submit", "spec": {"name": "j", "entry": "m:f", "min_nodes": 1, "max_nodes": 32, **spec}})
    return reply if not reply["ok"] else ctl.world.jobs[reply["job_id"]].spec


def test_the_controller_caps_a_job_at_the_nodes_its_global_batch_feeds(tmp_path, write):
    ctl = _controller(tmp_path, write, ranks_per_node=4)
    assert _submit(ctl, global_batch=64)["max_nodes"] == 16  # 64 samples, 4 ranks a node: 16 nodes, one sample a rank
    assert _submit(ctl, global_batch=64, min_per_rank=8)["max_nodes"] == 2
    assert _submit(ctl, global_batch=4096)["max_nodes"] == 32  # its own bound stands where the batch feeds more
    assert _submit(ctl)["max_nodes"] == 32  # no declaration: as before
    refused = _submit(ctl, global_batch=16, min_per_rank=8, min_nodes=2)
    assert not refused["ok"] and "global_batch 16 feeds 0 node(s)" in refused["error"]


def test_on_a_machine_of_several_kinds_the_node_with_most_ranks_sets_the_cap(tmp_path, write):
    types = (NodeTypeConfig(name="cpu", nodes=32), NodeTypeConfig(name="gpu", nodes=32, ranks_per_node=8))
    ctl = _controller(tmp_path, write, ranks_per_node=1, node_types=types)
    assert _submit(ctl, global_batch=64)["max_nodes"] == 8


def _report(ctl: Controller, job: str, position: float, samples: float = 64.0) -> float:
    reply = ctl.handle({"type": "job.report", "job_id": job, "host": "n0", "samples": samples, "seconds": 1.0, "position": position})
    assert reply["ok"], reply
    return reply["progress"]


def _job(ctl: Controller):
    reply = ctl.handle({"type": "job.submit", "spec": {"name": "j", "entry": "m:f", "min_nodes": 1, "max_nodes": 4, "global_batch": 64}})
    return ctl.world.jobs[reply["job_id"]]


def test_progress_is_the_loaders_position_and_redone_what_the_ranks_did_again(tmp_path, write):
    ctl = _controller(tmp_path, write)
    job = _job(ctl)
    for k in range(1, 5):
        assert _report(ctl, job.id, 64.0 * k) == 64.0 * k
    ctl.handle({"type": "job.commit", "job_id": job.id})
    for k in range(5, 8):
        _report(ctl, job.id, 64.0 * k)
    assert (job.progress, job.committed, job.redone) == (448.0, 256.0, 0.0)
    # A hard stop: the controller falls back to the commit; the new ranks resume there and redo 3 batches.
    ctl.world.roll_back(job)
    assert (job.progress, job.redone) == (256.0, 192.0)
    for k in range(5, 9):
        _report(ctl, job.id, 64.0 * k)
    assert (job.progress, job.redone) == (512.0, 192.0)


def test_ranks_that_trained_on_after_the_controller_fell_back_are_counted_as_what_they_did(tmp_path, write):
    """The torch runtime restarts ranks a moment after the controller decided a resize: the old ones train on, may
    commit, and the new ones resume from that commit — or from the one before, when the old ones did not get there."""
    ctl = _controller(tmp_path, write)
    job = _job(ctl)
    for k in range(1, 5):
        _report(ctl, job.id, 64.0 * k)
    ctl.handle({"type": "job.commit", "job_id": job.id})
    _report(ctl, job.id, 320.0)
    ctl.world.roll_back(job)  # the resize: the controller expects a redo from 256
    _report(ctl, job.id, 384.0)  # ... but the old ranks train on
    ctl.handle({"type": "job.commit", "job_id": job.id})  # and commit at 384: the new ranks will resume there
    assert (job.progress, job.committed, job.redone) == (384.0, 384.0, 0.0)
    _report(ctl, job.id, 448.0)
    ctl.world.roll_back(job)  # another resize; the old ranks do one more batch, then are ended without a commit
    _report(ctl, job.id, 512.0)
    _report(ctl, job.id, 448.0)  # the new ranks: from the commit at 384, again
    assert (job.progress, job.redone) == (448.0, 128.0)  # 384-512 was done twice, so far 448 of it
    _report(ctl, job.id, 512.0)
    assert (job.progress, job.redone) == (512.0, 128.0)
    assert ctl.world.counters["samples_redone"] == 128


def test_a_report_with_a_position_behind_its_samples_is_refused(tmp_path, write):
    ctl = _controller(tmp_path, write)
    job = _job(ctl)
    reply = ctl.handle({"type": "job.report", "job_id": job.id, "host": "n0", "samples": 64.0, "seconds": 1.0, "position": 10.0})
    assert not reply["ok"] and "position must be" in reply["error"]
