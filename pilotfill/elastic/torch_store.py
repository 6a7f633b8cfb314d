"""The run's torch store: one ``TCPStore`` server on the controller's machine, never on a compute node.

    python -m pilotfill.elastic.torch_store --run-dir RUN [--host ADDRESS]

Started once by the torch runtime (:mod:`pilotfill.elastic.torch`); it listens
on a random port and writes ``{"host", "port", "pid"}`` to
``RUN/torch_store.json`` (mode 0600, atomically) for the runtime, which hands
it out in rendezvous replies. Rank 0's node holds nothing: when any node goes,
the store and every other round's keys stay.

Threat model. ``TCPStore`` has no authentication: anyone who can reach the
port can connect and read or write any key *whose name they know*. It has no
call that lists keys. So every round's keys — the agents' and the workers'
(``init_process_group`` and gloo's address exchange) — live under that round's
random 128-bit prefix, which exists only in the controller's memory, in the
HMAC-authenticated ``rdzv.join`` reply to a member of the round, and in that
round's agent and worker processes (environment: readable by the same user
only). Without the run's secret (``secret.key``, 0600) one never learns a
prefix, so one cannot join a round, read peers' addresses, or slip into gloo's
mesh by overwriting one. Rounds and jobs cannot see each other's keys either,
so a worker of an old round never reads a stale address.

Not covered, as for torchrun, Horovod and NCCL: someone who can *sniff* the
cluster network (the reply, the store protocol and gloo's traffic are not
encrypted — only signed), and denial of service (connecting, flooding, writing
junk keys under other names, ``num_keys``). A Python ``Store`` over pilotfill's
signed transport would close the first for the store's own traffic only, cost a
controller round trip per blocking ``get``/``wait`` of every worker's gloo
bootstrap, and need user code to pass it to ``init_process_group``; the
capability prefix gives the same protection against other users at TCPStore
speed with plain ``init_process_group()``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

from ..procs import die_with_parent

PORT_FILE = "torch_store.json"


def read_port_file(run_dir: Path) -> dict | None:
    """The store's ``{"host", "port", "pid"}``, or None before it has started."""
    try:
        info = json.loads((Path(run_dir) / PORT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and isinstance(info.get("port"), int) else None


def write_port_file(run_dir: Path, info: dict) -> None:
    path = Path(run_dir) / PORT_FILE
    tmp = path.with_name(f".{PORT_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(info))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pilotfill.elastic.torch_store")
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--host", default="127.0.0.1", help="the address clients on the nodes connect to")
    args = ap.parse_args(argv)
    die_with_parent()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: os._exit(0))  # nothing to flush: the keys die with us
    from torch.distributed import TCPStore

    # The server listens on every interface; ``host`` is only what this process's own client uses.
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    write_port_file(args.run_dir, {"host": args.host, "port": store.port, "pid": os.getpid()})
    print(f"torch store listening on port {store.port} (clients use {args.host})", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
