"""Runtimes by name: the one table a new runtime is added to.

``[runtime] kind``, ``@elastic_app(runtime=…)``, a job spec's ``runtime`` and the
controller's choice of runtime all read this table. Each entry is a lazy
``"module:Class"`` (naming the runtimes imports none of them). The runtime class
says the rest (:class:`~pilotfill.elastic.base.Runtime`): how it is made from a
config (``from_config``) and the messages of its own it answers (``handles``, e.g.
the torch agents' ``rdzv.*``), which the controller routes to it.

Adding a runtime: one module here with its class, one line below, its messages in
:mod:`pilotfill.protocol`, docs/campaigns.md and its tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..plugins import load

if TYPE_CHECKING:
    from .base import Runtime

RUNTIMES: dict[str, str] = {
    "processes": "pilotfill.elastic.processes:ProcessRuntime",
    "horovod": "pilotfill.elastic.horovod:HorovodRuntime",
    "torch": "pilotfill.elastic.torch.runtime:TorchRuntime",
}

NAMES: tuple[str, ...] = tuple(RUNTIMES)


def runtime_class(name: str) -> type[Runtime]:
    """The runtime class of ``name`` (imported on first use)."""
    return load(RUNTIMES, name, "runtime")
