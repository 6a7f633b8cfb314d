"""Real torch ranks without a controller: ``world`` processes joined by gloo through a file, each running one function.

A test that checks what ranks compute together (the loader's split, its scale, digits' order over a resize) runs
them here: real ``torch.distributed`` and real processes, nothing else of pilotfill. ``run_ranks`` starts them and
waits; each rank runs ``python -m gloo_ranks MODULE:FUNCTION ARGS_JSON`` and calls ``FUNCTION(**ARGS)`` after
``init_process_group`` (``RANK``/``WORLD_SIZE`` set as the runtimes set them).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def run_ranks(target: str, world: int, rendezvous: Path, timeout_s: float = 600.0, env: dict[str, str] | None = None, **kwargs: Any) -> list[int]:
    """Run ``target`` ('module:function') on ``world`` gloo ranks; return their exit codes (a hung group is killed)."""
    rendezvous.unlink(missing_ok=True)
    base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO), os.environ.get("PYTHONPATH", "")]), **(env or {})}
    procs = []
    for rank in range(world):
        rank_env = {**base, "RANK": str(rank), "WORLD_SIZE": str(world), "GLOO_RANKS_INIT": f"file://{rendezvous}", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-m", "gloo_ranks", target, json.dumps(kwargs)], env=rank_env))
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
    return codes


def main() -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    target, kwargs = sys.argv[1], json.loads(sys.argv[2])
    dist.init_process_group("gloo", init_method=os.environ["GLOO_RANKS_INIT"], rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    module, function = target.split(":")
    try:
        getattr(importlib.import_module(module), function)(**kwargs)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
