"""Batch systems by name: the one table a new batch system is added to (RADICAL-Pilot's resource-manager table).

``scheduler = "pbs"`` in a config, ``--scheduler pbs`` on an agent's command line
and the controller's choice of adapter all read this table. Each entry is a
lazy ``"module:Class"`` so naming the systems imports none of them (the config
is checked before anything else is loaded). The adapter class says the rest
itself (:class:`~pilotfill.schedulers.base.BatchScheduler`): its ``title``, the
``[node_types]`` keys that select its nodes, how it is made from a config
(``from_config``) and what its pilots' agents ask of it from inside the job
(``node_access``: this job's nodes and id, running a process on another node,
ending it there).

Adding a batch system: one module here with its adapter, its node access and its
config section (the adapter's ``config_class``, ``bounds`` and ``parse_section``:
:mod:`pilotfill.config` parses whatever this table names), one line below,
docs/sites.md and its tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..plugins import load

if TYPE_CHECKING:
    from .base import BatchScheduler

BATCH_SYSTEMS: dict[str, str] = {
    "local": "pilotfill.schedulers.local:LocalScheduler",
    "slurm": "pilotfill.schedulers.slurm:SlurmScheduler",
    "pbs": "pilotfill.schedulers.pbs:PbsScheduler",
}

NAMES: tuple[str, ...] = tuple(BATCH_SYSTEMS)


def adapter_class(name: str) -> type[BatchScheduler]:
    """The adapter class of the batch system ``name`` (imported on first use)."""
    return load(BATCH_SYSTEMS, name, "batch system")
