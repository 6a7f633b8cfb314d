"""A model's descriptor, computed from the model itself: what the similarity policy compares.

    from pilotfill.describe import describe
    describe(model, example_batch)   # {"parameters": …, "flops_per_sample": …, "layers": …, "batch_size": …,
"mix": {…}}

* ``parameters``: every parameter's element count;
* ``flops_per_sample``: multiply-accumulates of one sample's forward pass
  (``torch.utils.flop_counter`` counts two FLOPs per multiply-accumulate; this
  is half its count, torchvision's "GFLOPS" convention), measured on the
  example batch without gradients, in eval mode (nothing the model keeps,
  such as batch-norm statistics, changes), divided by its size;
* ``layers``: the layers that compute — convolutions, dense layers, recurrent
  layers (each of ``num_layers``), attention blocks;
* ``batch_size``: the example batch's first dimension (per rank), unless given;
* ``mix``: each kind's share of the parameters (conv, linear, recurrent,
  attention, embedding, norm, other), from the module tree.

Nobody has to call it: :class:`pilotfill.elastic.ElasticState` is given the
model, and on its first forward pass on rank 0 it describes the model from
the batch it is given and tells the controller (``job.describe``), which
predicts the job's curve on the node types it has not run on from the models
most like it. Where the code cannot be inspected, declare it instead:
``@pilotfill.elastic_app(..., model={"parameters": 25.6e6, "batch_size": 64})``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

log = logging.getLogger("pilotfill.describe")

KINDS = {
    "conv": (torch.nn.modules.conv._ConvNd,),
    "recurrent": (torch.nn.RNNBase, torch.nn.RNNCellBase),
    "attention": (torch.nn.MultiheadAttention,),
    "embedding": (torch.nn.Embedding, torch.nn.EmbeddingBag),
    "norm": (torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.LocalResponseNorm),
    "linear": (torch.nn.Linear, torch.nn.Bilinear),
}


def kind_of(module: torch.nn.Module) -> str:
    for kind, classes in KINDS.items():
        if isinstance(module, classes):
            return kind
    return "other"


def describe(model: torch.nn.Module, example: Any, batch_size: int | None = None) -> dict[str, Any]:
    """The descriptor of ``model`` (see the module docstring); ``example``: a batch it takes (a tensor, or a tuple of
    its positional arguments)."""
    from torch.utils.flop_counter import FlopCounterMode

    args = example if isinstance(example, tuple) else (example,)
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    batch = batch_size or (int(first.shape[0]) if first is not None and first.dim() > 0 else 1)
    per_kind: dict[str, int] = {}
    layers = 0
    for module in model.modules():
        kind = kind_of(module)
        own = sum(p.numel() for p in module.parameters(recurse=False))
        if kind == "attention":
            # its out_proj is a Linear of its own
            own = sum(p.numel() for name, p in module.named_parameters() if not name.startswith("out_proj."))
        if own:
            per_kind[kind] = per_kind.get(kind, 0) + own
        if kind in ("conv", "linear", "attention"):
            layers += 1
        elif kind == "recurrent":
            layers += int(getattr(module, "num_layers", 1))
    total = sum(p.numel() for p in model.parameters())
    modes = {m: m.training for m in model.modules()}
    recurrent: list[int] = []  # multiply-accumulates of recurrent layers, which the flop counter does not see
    hooks = [
        m.register_forward_hook(lambda mod, inp, out: recurrent.append(_rnn_macs(mod, inp)))
        for m in model.modules()
        if isinstance(m, torch.nn.RNNBase)
    ]
    try:
        model.eval()
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter:
            model(*args)
        flops = (counter.get_total_flops() / 2 + sum(recurrent)) / batch
    finally:
        for h in hooks:
            h.remove()
        for m, training in modes.items():
            m.training = training
    counted = sum(per_kind.values())
    out: dict[str, Any] = {"parameters": float(total), "layers": float(max(1, layers)), "batch_size": float(batch)}
    if flops > 0:
        out["flops_per_sample"] = float(flops)
    if counted:
        out["mix"] = {k: v / counted for k, v in sorted(per_kind.items())}
    return out


def _rnn_macs(module: torch.nn.RNNBase, inputs: tuple) -> int:
    """Multiply-accumulates of one pass of a recurrent layer: gates × hidden × (input + hidden) per step and layer."""
    x = inputs[0]
    if not isinstance(x, torch.Tensor):  # a packed sequence
        x = x.data
        steps_by_batch = x.shape[0]
    else:
        steps_by_batch = x.shape[0] * x.shape[1] if x.dim() == 3 else x.shape[0]
    gates = {"LSTM": 4, "GRU": 3}.get(module.mode, 1)
    directions = 2 if module.bidirectional else 1
    total = 0
    for layer in range(module.num_layers):
        width = module.input_size if layer == 0 else module.hidden_size * directions
        total += gates * module.hidden_size * (width + module.hidden_size) * directions
    return int(total * steps_by_batch)


def watch(model: torch.nn.Module) -> None:
    """Describe ``model`` on its first forward pass and tell the controller (rank 0 of a pilotfill job only).

    The first batch is measured on its own, before the forward pass it came with runs, without gradients and in
    eval mode: the model's training is not changed. Any failure is logged and forgotten — a descriptor is a hint.
    """
    if (
        not os.environ.get("PILOTFILL_JOB_ID")
        or os.environ.get("RANK", "0") != "0"
        or getattr(model, "_pilotfill_watched", False)
    ):
        return
    model._pilotfill_watched = True  # type: ignore[attr-defined]
    handle = None

    def first_forward(module: torch.nn.Module, args: tuple, kwargs: dict | None = None) -> None:
        handle.remove()
        try:
            descriptor = describe(module, tuple(args))
            from .report import describe as send

            send(descriptor)
        except Exception as exc:  # noqa: BLE001 - a hint is never worth a failed training step
            log.warning("model not described (the similarity policy learns this job from nothing): %s", exc)

    handle = model.register_forward_pre_hook(first_forward)
