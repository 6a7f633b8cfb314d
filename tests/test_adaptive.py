"""Adaptive global batches (pilotfill.elastic.adaptive): the rules, the noise estimate, the loader, the allocator's value."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pilotfill.allocator import ScalingCurve
from pilotfill.elastic.adaptive import Adaptive, GradientNoise, efficiency
from pilotfill.elastic.loader import ElasticLoader, shares

pytestmark = pytest.mark.unit


def test_the_batch_grows_with_the_ranks_up_to_its_most_and_the_rules_scale_the_rate():
    a = Adaptive(64, max_batch=256, rule="sqrt")
    assert [a.batch(w) for w in (1, 2, 3, 4, 8)] == [64, 128, 192, 256, 256]
    assert a.lr_factor(256) == pytest.approx(2.0)
    assert Adaptive(64, rule="linear").lr_factor(256) == pytest.approx(4.0)
    assert Adaptive(64).lr_factor(256) == 1.0  # AdaScale before anything is measured: the rate as tuned
    for bad in ({"base_batch": 0}, {"base_batch": 64, "max_batch": 32}, {"base_batch": 64, "rule": "cubic"}):
        with pytest.raises(ValueError):
            Adaptive(**bad)


def _noisy_steps(noise: GradientNoise, mu: np.ndarray, sigma: float, world: int, batch: int, steps: int, rng: np.random.Generator) -> None:
    """Steps of per-sample gradients ``mu + N(0, sigma²)`` split over ``world`` ranks as the loader splits them."""
    for _ in range(steps):
        grads = mu + sigma * rng.standard_normal((batch, mu.size))
        parts = [grads[lo:hi].mean(0) for lo, hi in shares(batch, world)]
        local = np.mean([p @ p for p in parts])
        inverse = np.mean([1.0 / (hi - lo) for lo, hi in shares(batch, world)])
        g = grads.mean(0)
        noise.update(float(local), float(inverse), float(g @ g), batch)


def test_the_noise_scale_is_measured_from_the_ranks_gradients():
    rng = np.random.default_rng(0)
    mu, sigma = np.full(50, 0.1), 1.0  # |mu|^2 = 0.5, per-sample variance trace 50: noise scale 100 samples
    noise = GradientNoise()
    _noisy_steps(noise, mu, sigma, world=4, batch=128, steps=400, rng=rng)
    assert noise.noise_scale == pytest.approx(100.0, rel=0.25)
    assert 1.0 < noise.gain(64, 256) < 4.0  # between no gain and linear
    assert noise.gain(64, 256) == pytest.approx((100 / 64 + 1) / (100 / 256 + 1), rel=0.2)
    alone = GradientNoise()
    _noisy_steps(alone, mu, sigma, world=1, batch=128, steps=10, rng=rng)
    assert alone.noise_scale is None and alone.gain(64, 256) == 1.0  # one rank tells the variance from nothing


def test_efficiency_is_one_at_the_base_batch_and_falls_with_a_bigger_one():
    assert efficiency(64, 64, 100.0) == 1.0
    assert efficiency(256, 64, 100.0) == pytest.approx(164 / 356)
    assert efficiency(256, 64, None) == pytest.approx(128 / 320)  # unmeasured: the base batch taken as the noise scale
    assert efficiency(256, 64, 1e9) == pytest.approx(1.0, rel=1e-6)  # all noise: every sample counts


def test_an_adaptive_loader_trains_every_sample_once_per_epoch_whatever_the_ranks_did():
    x = torch.arange(1000, dtype=torch.float32).unsqueeze(1)
    worlds = iter([1] * 3 + [3] * 4 + [2] * 100)
    seen: list[int] = []
    sizes = []
    state = {"world": 1}

    def world() -> tuple[int, int]:
        return 0, state["world"]

    loader = ElasticLoader(x, Adaptive(50, max_batch=120, rule="linear"), seed=1, report=False, world=world)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    loader.adapt(optimizer)
    while loader.epoch < 1:
        for batch in loader:
            # rank 0's share only: the whole batch is what all ranks take; count it from the plan's start and size
            seen.extend(loader.order(0)[batch.start : batch.start + batch.size].tolist())
            sizes.append(batch.size)
            assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * batch.lr_factor) and batch.lr_factor == pytest.approx(batch.size / 50)
            state["world"] = next(worlds)
    assert sorted(seen) == list(range(1000)), "every sample once in the epoch"
    assert sizes[:3] == [50, 50, 50] and 120 in sizes and 100 in sizes


def test_a_restored_adaptive_loader_scales_the_rate_the_app_set_not_the_scaled_one():
    x = torch.zeros(400, 1)
    loader = ElasticLoader(x, Adaptive(50, rule="linear"), report=False, world=lambda: (0, 4))
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    loader.adapt(optimizer)
    next(iter(loader))
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.4)
    saved, opt_saved = loader.state_dict(), optimizer.state_dict()
    again = ElasticLoader(x, Adaptive(50, rule="linear"), report=False, world=lambda: (0, 4))
    optimizer2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    again.adapt(optimizer2)
    optimizer2.load_state_dict(opt_saved)  # what ElasticState restores: the scaled rate
    again.load_state_dict(saved)
    next(iter(again))
    assert optimizer2.param_groups[0]["lr"] == pytest.approx(0.4), "scaled once, not twice"


def test_the_allocator_values_an_adaptive_jobs_nodes_by_samples_times_efficiency():
    from pilotfill.controller.views import adaptive_objective

    curve = ScalingCurve((0, 1, 2, 4), (0.0, 100.0, 200.0, 400.0))
    value = adaptive_objective(curve, Adaptive(64), ranks_per_node=1, noise_scale=64.0)
    assert value.values == pytest.approx((0.0, 100.0, 200.0 * 128 / 192, 400.0 * 128 / 320))
    assert value.at(4) < 4 * value.at(1)  # four nodes are worth less than four times one


def test_an_adaptive_spec_is_checked_and_declared_by_the_decorator():
    import inspect

    from pilotfill.executors.decorator import RESOURCE_KEY, elastic_app
    from pilotfill.protocol import ProtocolError, check_spec

    base = {"name": "a", "entry": "m:f", "min_nodes": 1, "max_nodes": 4}
    assert check_spec({**base, "adaptive": {"base_batch": 64, "max_batch": None, "rule": "sqrt"}})["adaptive"]["rule"] == "sqrt"
    with pytest.raises(ProtocolError, match="adaptive"):
        check_spec({**base, "adaptive": {"base_batch": 64, "rule": "cubic"}})
    def train() -> None:
        """The app's function: only decorated here, never run."""

    app = elastic_app(min_nodes=1, max_nodes=4, global_batch=Adaptive(64, max_batch=512))(train)
    spec = inspect.signature(app.func).parameters[RESOURCE_KEY].default
    assert spec["adaptive"] == {"base_batch": 64, "max_batch": 512, "rule": "adascale"}
    assert spec["global_batch"] == 512  # the largest batch: the most ranks it feeds
    assert check_spec({**base, "adaptive": spec["adaptive"], "global_batch": 512})


def test_rank_0_reports_the_measured_noise_scale_and_the_controller_keeps_it(monkeypatch, tmp_path, write):
    import sys

    from pilotfill.protocol import JobReport, ProtocolError

    said: list[dict] = []
    monkeypatch.setenv("PILOTFILL_JOB_ID", "j1")
    monkeypatch.setattr(sys.modules["pilotfill.elastic.loader"], "report", lambda samples, position, **more: said.append(more))
    loader = ElasticLoader(torch.zeros(100, 1), Adaptive(20), world=lambda: (0, 2))
    loader.noise.var, loader.noise.sq, loader.noise.steps = 30.0, 0.5, 3
    list(loader)
    assert said and all(s == {"noise_scale": pytest.approx(60.0)} for s in said)
    with pytest.raises(ProtocolError, match="noise_scale"):
        JobReport("j1", "n0", 1.0, 1.0, noise_scale=-1.0).validate()

    from test_controller_core import Machine, linear

    m = Machine(tmp_path, write, 2, [linear("a", 1, 2, 100.0)])
    m.submit("a", adaptive={"base_batch": 32, "max_batch": None, "rule": "sqrt"})
    m.at(1.0)
    job = m.job("a")
    assert job.nodes, "the adaptive job runs"
    assert m.ctl.handle(JobReport(job.id, job.nodes[0], 64.0, 1.0, noise_scale=60.0).to_dict())["ok"]
    assert job.noise_scale == 60.0
    value = m.ctl.views.view(job).metric(next(iter(m.ctl.views.view(job).throughput)))
    assert value.at(2) == pytest.approx(200.0 * (60 + 32) / (60 + 64))  # two nodes: a batch of 64, worth less per sample
