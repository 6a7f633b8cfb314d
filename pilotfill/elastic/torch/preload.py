"""Imported once by each torch agent's forkserver, so that every worker forked from it starts warm.

A worker's first seconds are imports: torch, torch.distributed, the job's own
module (``PILOTFILL_PRELOAD_MODULE``; one that fails to import is left to the
workers, which report it) and ``torch._dynamo``, which the first optimizer
imports. Done once here, a restarted worker skips them.

Nothing here runs a backward pass or starts threads: autograd's and OpenMP's
thread pools do not survive ``fork``. The forkserver ignores SIGTERM, its
workers do not (the agent gives them their grace); it dies with its agent
(``PR_SET_PDEATHSIG``, set first thing), taking its workers along: otherwise a
SIGKILLed agent left them training as orphans.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

from pilotfill.procs import die_with_parent

die_with_parent()

import torch
import torch._dynamo  # noqa: F401  (imported by the first optimizer otherwise)
import torch.distributed  # noqa: F401
import torch.nn.parallel  # noqa: F401

import pilotfill.elastic.state  # noqa: F401
import pilotfill.elastic.torch.worker  # noqa: F401
import pilotfill.report  # noqa: F401
from pilotfill.elastic.collectives import configure_process_groups
from pilotfill.elastic.guard import refuse_horovod


def _preload_job_module() -> None:
    name = os.environ.get("PILOTFILL_PRELOAD_MODULE")
    if not name:
        return
    try:
        importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001 - the forkserver must live; the workers will report it
        print(f"pilotfill: preloading {name} failed: {exc!r}", file=sys.stderr, flush=True)


# A SIGTERM to the agent's process group (its node released or preempted) must not end the forkserver: its workers die
# with it (PR_SET_PDEATHSIG), and they get the pilot's grace from their agent. It ends with its agent (its pipe closes).
signal.signal(signal.SIGTERM, signal.SIG_IGN)
# the workers it forks do not ignore it
os.register_at_fork(after_in_child=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
refuse_horovod("torch")  # before the job's module: one that imports horovod.torch binds hvd.init as it is then
configure_process_groups()
_preload_job_module()
