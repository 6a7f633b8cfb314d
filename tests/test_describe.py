"""Model descriptors computed from the model itself (the similarity policy's input): counts checked by hand on
small models, the first-forward hook that tells the controller without changing training, and the controller's
``job.describe``."""

from __future__ import annotations

import importlib

import pytest
import torch
from localrun import synthetic_job

from pilotfill.describe import describe, watch

pytestmark = pytest.mark.unit

REPORT = importlib.import_module("pilotfill.report")  # the module (``pilotfill.report`` is also the function)


def test_counts_follow_from_the_layers():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10))
    d = describe(model, torch.randn(4, 3, 8, 8))
    assert d["parameters"] == (3 * 8 * 9 + 8) + 16 + (512 * 10 + 10)
    # Multiply-accumulates per sample: the convolution 8·8 positions × 8 filters × 3·3·3, the dense layer 512 × 10.
    assert d["flops_per_sample"] == 8 * 8 * 8 * 27 + 512 * 10
    assert d["batch_size"] == 4 and d["layers"] == 2
    assert d["mix"]["linear"] == pytest.approx(5130 / (224 + 16 + 5130)) and set(d["mix"]) == {"conv", "norm", "linear"}


def test_recurrent_layers_are_counted_though_the_flop_counter_does_not_see_them():
    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.rnn, self.out = torch.nn.Embedding(100, 10), torch.nn.LSTM(10, 20, num_layers=2, batch_first=True), torch.nn.Linear(20, 100)

        def forward(self, x):
            return self.out(self.rnn(self.emb(x))[0])

    d = describe(LM(), torch.randint(0, 100, (3, 7)))
    # Per sample (7 steps): LSTM layer 1: 4 gates × 20 × (10 + 20), layer 2: 4 × 20 × (20 + 20), the decoder 20 × 100.
    assert d["flops_per_sample"] == 7 * (4 * 20 * 30 + 4 * 20 * 40 + 20 * 100)
    assert d["layers"] == 3 and max(d["mix"], key=d["mix"].get) == "recurrent"


def test_the_first_forward_pass_describes_the_model_once_and_changes_nothing(monkeypatch):
    sent = []
    monkeypatch.setenv("PILOTFILL_JOB_ID", "j1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(REPORT, "describe", lambda model: sent.append(model) or True)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    model.train()
    watch(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(5, 6)
    expected = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    expected.load_state_dict(before)
    expected.train()
    assert torch.allclose(model(x), expected(x))  # the pass it came with ran as it would have
    # Only that training pass moved the batch-norm statistics, not the measuring one (eval mode, no gradients).
    assert torch.equal(model.state_dict()["1.running_mean"], expected.state_dict()["1.running_mean"])
    assert not torch.equal(before["1.running_mean"], model.state_dict()["1.running_mean"])
    model(x)
    assert len(sent) == 1 and sent[0]["batch_size"] == 5 and sent[0]["parameters"] == 6 * 4 + 4 + 8 + 4 * 2 + 2
    assert model.training and all(m.training for m in model.modules())


def test_watch_does_nothing_outside_pilotfill_or_on_other_ranks(monkeypatch):
    sent = []
    monkeypatch.setattr(REPORT, "describe", lambda model: sent.append(model))
    monkeypatch.delenv("PILOTFILL_JOB_ID", raising=False)
    model = torch.nn.Linear(3, 1)
    watch(model)
    model(torch.randn(2, 3))
    monkeypatch.setenv("PILOTFILL_JOB_ID", "j1")
    monkeypatch.setenv("RANK", "1")
    other = torch.nn.Linear(3, 1)
    watch(other)
    other(torch.randn(2, 3))
    assert sent == []


@pytest.mark.local
def test_the_controller_keeps_the_first_descriptor_of_a_job(local):
    run = local()
    run.start()
    job = synthetic_job("j", total=1e9, hi=1)
    del job["curve"]
    job_id = run.client.submit(job)
    model = {"parameters": 1000.0, "batch_size": 32.0, "mix": {"linear": 1.0}}
    from pilotfill.transport import Client, RequestRefused

    client = Client(run.run_dir)
    try:
        with pytest.raises(RequestRefused, match="mix: unknown layer kind 'lstm'"):
            client.request({"type": "job.describe", "job_id": job_id, "model": {"mix": {"lstm": 1.0}}})
        reply = client.request({"type": "job.describe", "job_id": job_id, "model": model})
        again = client.request({"type": "job.describe", "job_id": job_id, "model": {"parameters": 5.0}})
    finally:
        client.close()
    assert reply["kept"] is True and again["kept"] is False
    assert run.client.job(job_id)["spec"]["model"] == model
    assert [e["data"]["model"] for e in run.events("job.described")] == [model]
