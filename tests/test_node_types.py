"""Machines with several kinds of node, end to end: configs, the local cluster with two types, jobs placed on the
type that suits them (by their curves per type, or by the similarity policy before they have run), why, and top."""

from __future__ import annotations

import json

import pytest
from localrun import synthetic_job

from pilotfill.allocator import ScalingCurve
from pilotfill.allocator.similarity import Descriptor, Library, Measured
from pilotfill.library_file import write_library
from pilotfill.config import ConfigError, parse_config

pytestmark = pytest.mark.unit

TYPED = """
scheduler = "local"
[local]
nodes = 4
workload = "none"
[node_types.big]
nodes = 2
ranks_per_node = 2
[node_types.small]
nodes = 2
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 5.0
grace_s = 3.0
[controller]
tick_s = 0.1
t_fwd = 30.0
[runtime]
kind = "processes"
"""


def per_type(job: dict, rates: dict[str, float]) -> dict:
    """``job`` with a curve per node type: linear at ``rates[type]`` samples/s per node."""
    hi = job["max_nodes"]
    job = dict(job)
    del job["curve"]
    job["curves"] = {t: {"nodes": list(range(hi + 1)), "samples_per_s": [r * n for n in range(hi + 1)]} for t, r in rates.items()}
    return job


@pytest.mark.parametrize(
    "text, message",
    [
        ('scheduler = "slurm"\n[node_types.a]\nselect = "x=1"\n[node_types.b]\nconstraint = "b"', "node_types.a.select: is how PBS selects nodes"),
        ('scheduler = "slurm"\n[node_types.a]\nranks_per_nodes = 2\n[node_types.b]\nconstraint = "b"', "node_types.a.ranks_per_nodes: unknown key; did you mean ranks_per_node?"),
        ('scheduler = "pbs"\n[node_types.a]\n[node_types.b]\nqueue = "b"', "node_types.a: says nothing that selects these nodes: set select or queue"),
        ('[local]\nnodes = 4\n[node_types.a]\nnodes = 1\n[node_types.b]\nnodes = 2', "the types' nodes add up to 3, but \\[local\\] nodes = 4"),
        ('[node_types.a]\nnodes = 4', "one node type only"),
        ('[node_types."a b"]\nnodes = 2\n[node_types.c]\nnodes = 2', "node_types.a b: a node type's name is letters"),
        ('scheduler = "slurm"\nnode_types = "a100"', r"node_types: must be a table .*one table per kind of node, e.g. \[node_types.a100\]"),
    ],
)
def test_node_type_configs_are_checked_with_the_key(text, message):
    import tomllib

    with pytest.raises(ConfigError, match=message):
        parse_config(tomllib.loads(text), "site.toml")


@pytest.mark.local
def test_each_job_lands_on_the_type_that_suits_it_on_a_typed_local_cluster(local):
    run = local(config=TYPED)
    run.start()
    # A is 10x faster on big; B is faster on small. Two nodes each: A on big and B on small is the only best answer.
    # 15-30 s of training: long enough for a pilot that joins late on a busy machine to be grown onto.
    a = run.client.submit(per_type(synthetic_job("a", total=2400, hi=2), {"big": 100.0, "small": 10.0}))
    b = run.client.submit(per_type(synthetic_job("b", total=2400, hi=2), {"big": 20.0, "small": 30.0}))
    run.wait_for(lambda: all(run.client.job(j)["status"] == "finished" for j in (a, b)), 180, "both jobs to finish")
    started = {e["job"]: e["data"] for e in run.events("job.started")}
    assert started[a]["node_type"] == "big" and started[b]["node_type"] == "small"
    assert "fastest here" in started[a]["why"] and "fastest here" in started[b]["why"]
    # Each held only its type's nodes, both of them at its widest: a job starts on the first of its nodes to join (on a
    # busy machine its second pilot may come later) and grows onto the next.
    held = {j: [set(started[j]["nodes"])] + [set(e["data"]["nodes"]) for e in run.events("job.resized") if e["job"] == j] for j in (a, b)}
    assert set().union(*held[a]) == {"pf-node-0", "pf-node-1"} and {"pf-node-0", "pf-node-1"} in held[a], held[a]
    assert set().union(*held[b]) == {"pf-node-2", "pf-node-3"} and {"pf-node-2", "pf-node-3"} in held[b], held[b]
    # Pilots asked for one type each.
    submitted = [e["data"] for e in run.events("pilot.submitted")]
    assert {d["node_type"] for d in submitted} == {"big", "small"}
    state = run.state()
    try:
        kinds = {n["name"]: n["node_type"] for n in state.nodes()}
    finally:
        state.close()
    assert kinds == {"pf-node-0": "big", "pf-node-1": "big", "pf-node-2": "small", "pf-node-3": "small"}


@pytest.mark.local
def test_the_similarity_policy_places_new_jobs_before_they_have_run(local, tmp_path):
    lib = Library()
    conv = Descriptor(parameters=11e6, flops_per_sample=5.5e8, layers=18, batch_size=64, mix={"conv": 0.95, "linear": 0.05})
    dense = Descriptor(parameters=4e7, layers=2, batch_size=4096, mix={"linear": 1.0})
    lib.add(Measured("resnet-like", conv, {"big": ScalingCurve((0, 1, 2), (0, 500, 1000)), "small": ScalingCurve((0, 1, 2), (0, 100, 200))}))
    lib.add(Measured("recsys-like", dense, {"big": ScalingCurve((0, 1, 2), (0, 1000, 1000)), "small": ScalingCurve((0, 1, 2), (0, 2000, 2000))}))
    site = tmp_path / "site-models.json"
    write_library(lib, site)
    config = TYPED.replace("[pilots]", f'[similarity]\nlibraries = ["{site}"]\nlibrary = "{tmp_path / "mine.json"}"\n[pilots]')
    run = local(config=config)
    run.start()
    jobs = {}
    for name, model in (("cnn", {"parameters": 12e6, "flops_per_sample": 6e8, "layers": 20, "batch_size": 64, "mix": {"conv": 0.9, "linear": 0.1}}),
                        ("rec", {"parameters": 3e7, "layers": 2, "batch_size": 2048, "mix": {"linear": 1.0}})):  # fmt: skip
        job = synthetic_job(name, total=600, hi=1)  # 15 s of training: measured in steady state, on a busy machine too
        del job["curve"]  # nothing known: JPA learns it, starting from the prediction
        job["model"] = model
        jobs[name] = run.client.submit(job)
    run.wait_for(lambda: all(run.client.job(j)["status"] == "finished" for j in jobs.values()), 120, "both jobs to finish")
    first = {}
    for e in run.events("job.started"):
        first.setdefault(e["job"], e["data"])
    assert first[jobs["cnn"]]["node_type"] == "big" and "resnet-like" in first[jobs["cnn"]]["why"]
    assert first[jobs["rec"]]["node_type"] == "small" and "recsys-like" in first[jobs["rec"]]["why"]
    # What they measured joins the user's library for the next campaign; the site's library is only read.
    mine = json.loads((tmp_path / "mine.json").read_text())
    assert {m["model"] for m in mine["models"]} == {"cnn", "rec"}
    assert json.loads(site.read_text()) == lib.to_document()


def test_a_job_starts_with_its_types_ranks_and_gpus_per_node(tmp_path):
    import tomllib
    from types import SimpleNamespace

    from pilotfill.allocator import Profiler
    from pilotfill.controller.node_types import NodeTypes

    config = parse_config(tomllib.loads(TYPED.replace("ranks_per_node = 2", "ranks_per_node = 2\ngpus_per_node = 2")))
    types = NodeTypes(config, tmp_path / "run", Profiler())
    world = SimpleNamespace(nodes={"n0": SimpleNamespace(node_type="big"), "n1": SimpleNamespace(node_type="small")})
    job = SimpleNamespace(id="j1", spec={"name": "x", "min_nodes": 1, "max_nodes": 1})
    assert types.start_spec(world, job, ["n0"]) == {**job.spec, "ranks_per_node": 2, "gpus_per_node": 2}
    assert types.start_spec(world, job, ["n1"]) == job.spec  # small sets neither: the runtime's own


def test_elastic_app_takes_a_curve_per_type_and_a_model_descriptor():
    import pilotfill
    from pilotfill.executors.decorator import RESOURCE_KEY, ElasticAppError

    @pilotfill.elastic_app(min_nodes=1, max_nodes=2, curve={"a100": {"nodes": [0, 1, 2], "samples_per_s": [0, 10, 20]}}, model={"parameters": 1e6, "batch_size": 32})
    def train():
        return 1

    import inspect

    spec = inspect.signature(train.func).parameters[RESOURCE_KEY].default
    assert spec["curves"] == {"a100": {"nodes": [0, 1, 2], "samples_per_s": [0, 10, 20]}} and spec["curve"] is None
    assert spec["model"] == {"parameters": 1e6, "batch_size": 32.0}
    with pytest.raises(ElasticAppError, match=r"curve\['a100'\] must be"):
        pilotfill.elastic_app(curve={"a100": {"nodes": [1, 2], "samples_per_s": [1, 2]}})
    with pytest.raises(ElasticAppError, match="model: unknown key 'params'"):
        pilotfill.elastic_app(model={"params": 3})
