"""``pilotfill.workloads.digits`` under the torch runtime's code path, stopped after a commit and resumed elsewhere.

A rank entry for ``gloo_ranks``: the training set's first pixel (always 0 in the digits) carries each sample's index,
which the model's first forward hook records and clears, so what each rank trained on is known whatever digits does
inside; the run stops right after its ``stop_after``-th commit, as a job told to leave at a commit does.
"""

from __future__ import annotations

import json
import os

import torch


class Stopped(SystemExit):
    """The run left at a commit, as asked."""


def train(record: str | None, checkpoint: str, stop_after: int | None = None, epochs: int = 1, runtime: str = "torch", **kwargs) -> None:
    from pilotfill.elastic import state as elastic_state
    from pilotfill.workloads import digits

    os.environ["PILOTFILL_RUNTIME"] = runtime
    os.environ["PILOTFILL_CHECKPOINT"] = checkpoint
    rank, world = int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", 0))), int(os.environ.get("WORLD_SIZE", os.environ.get("HOROVOD_SIZE", 1)))
    real_data, real_model, real_commit = digits.data, digits.make_model, elastic_state.ElasticState.commit

    def data(seed: int = 0):
        xtr, ytr, xva, yva = real_data(seed)
        xtr, xva = xtr.clone(), xva.clone()
        xtr[:, 0] = torch.arange(len(xtr), dtype=xtr.dtype)
        xva[:, 0] = -1.0  # validation rows: not recorded
        return xtr, ytr, xva, yva

    def make_model(*args, **kw) -> torch.nn.Module:
        model = real_model(*args, **kw)

        def seen(module, inputs):
            x = inputs[0]
            mine = [int(i) for i in x[:, 0].tolist() if i >= 0]
            if mine and record:
                with open(record, "a") as f:
                    f.write(json.dumps({"rank": rank, "world": world, "pid": os.getpid(), "indices": mine}) + "\n")
            x = x.clone()
            x[:, 0] = 0.0
            return (x, *inputs[1:])

        model.register_forward_pre_hook(seen)
        return model

    commits = 0

    def commit(self) -> None:
        nonlocal commits
        real_commit(self)
        commits += 1
        if stop_after is not None and commits >= stop_after:
            raise Stopped(0)

    digits.data, digits.make_model, elastic_state.ElasticState.commit = data, make_model, commit
    try:
        result = digits.train(epochs=epochs, durable=True, **kwargs)
    except Stopped:
        return
    if rank == 0 and record:
        with open(record, "a") as f:
            f.write(json.dumps({"result": result}) + "\n")
