"""Process groups whose collectives cannot hang the survivors of a shrink (the torch runtime).

When a peer goes away mid-collective, the ranks left wait in it: gloo for its
timeout (30 min by default), NCCL for its watchdog's (10 min), unless the
process group is created with a shorter timeout and NCCL's asynchronous error
handling tears the process down (pytorch/elastic#115, pytorch/pytorch#111646).
pilotfill's agents restart their workers as soon as the controller changes a
job's hosts; this is the second line, for a peer that hangs or vanishes
without the controller knowing yet. What every worker of the torch runtime
gets, as torch 2.13 documents it:

* ``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``: on a collective's error or timeout the
  NCCL watchdog takes the process down without aborting the communicator (an
  abort can itself hang); the worker's exit makes its agent re-form the job;
* ``TORCH_NCCL_ENABLE_MONITORING=1`` and ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``
  = the collective timeout: a watchdog that is itself stuck (in a CUDA or NCCL
  call) is ended by the monitor thread after that long, not torch's 8 minutes;
* every process group the worker creates without a ``timeout=`` gets the
  collective timeout (``[runtime] collective_timeout_s``, 120 s by default)
  instead of torch's 10 min (NCCL) or 30 min (gloo): ``init_process_group``,
  ``new_group`` and every other way, since it is torch's default that changes.

A variable already set in the node's environment (a site's own choice) is
left as it is; a ``timeout=`` the code passes is used as given.
"""

from __future__ import annotations

import math
import os
from datetime import timedelta

TIMEOUT_ENV = "PILOTFILL_COLLECTIVE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 120.0


def worker_environment(timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, str]:
    """The variables every worker of the torch runtime starts with (before the node's own, which win)."""
    return {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_ENABLE_MONITORING": "1",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(max(1, math.ceil(timeout_s))),
        TIMEOUT_ENV: repr(float(timeout_s)),
    }


def configure_process_groups(timeout_s: float | None = None) -> timedelta:
    """Make ``timeout_s`` (default: ``$PILOTFILL_COLLECTIVE_TIMEOUT_S``) the timeout of every process group this
    process creates without one, whatever its backend. Returns it."""
    import torch.distributed.distributed_c10d as c10d

    if timeout_s is None:
        timeout_s = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    timeout = timedelta(seconds=timeout_s)
    for name in ("default_pg_timeout", "default_pg_nccl_timeout", "_get_default_timeout"):
        if not hasattr(c10d, name):
            raise RuntimeError(
                f"this torch has no distributed_c10d.{name}: pilotfill's process-group defaults are written for torch "
                "2.13"
            )
    c10d.default_pg_timeout = timeout  # gloo and every other backend
    c10d.default_pg_nccl_timeout = timeout  # NCCL (the module keeps its own default for it)
    return timeout
