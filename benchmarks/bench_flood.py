"""What bulk from someone without the run's keys costs the controller: its peak memory and how late it answers.

    python benchmarks/bench_flood.py [--messages 24] [--mb 50] [--seconds 20]

Starts a real controller (the local cluster, processes runtime) on a
temporary run directory, then a child process — as ``nobody`` when run as
root, else as this user, which makes no difference to it: it has no keys —
sends ``--messages`` messages of ``--mb`` MB with a made-up MAC to the
controller's port, while this process asks ``state.snapshot`` every 50 ms
for ``--seconds``. Prints the controller's peak RSS (VmHWM) before and after,
and the snapshot round trips before and during the flood.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = """scheduler = "local"
[local]
nodes = 2
workload = "none"
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 3.0
[controller]
tick_s = 0.1
[runtime]
kind = "processes"
"""


def vm_hwm_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for {pid}")


def attacker(endpoint: str, messages: int, size: int, go: int) -> int:
    """Fork a child (as nobody when we are root) that floods ``endpoint``; it waits for a byte on ``go`` to end."""
    pid = os.fork()
    if pid:
        return pid
    try:
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
        import zmq

        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, 5000)
        sock.connect(endpoint)
        blob = os.urandom(size)
        for _ in range(messages):
            try:
                sock.send_multipart([os.urandom(32), blob], copy=False)
            except zmq.Again:
                break
        os.read(go, 1)
    finally:
        os._exit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=24)
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    import encodings.idna  # noqa: F401 - the child may not be able to import it later

    from pilotfill.client import ControllerClient

    root = Path(tempfile.mkdtemp(prefix="pf-flood-"))
    (root / "config.toml").write_text(CONFIG)
    run_dir = root / "run"
    ctl = subprocess.Popen([sys.executable, "-m", "pilotfill.controller", "--run-dir", str(run_dir), "--config", str(root / "config.toml")],
                           stdout=open(root / "controller.out", "wb"), stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        deadline = time.time() + 60
        while not (run_dir / "controller.json").exists():
            if time.time() > deadline or ctl.poll() is not None:
                raise SystemExit(f"the controller did not start; see {root / 'controller.out'}")
            time.sleep(0.1)
        client = ControllerClient(run_dir)
        quiet = []
        for _ in range(50):
            t = time.monotonic()
            client.snapshot()
            quiet.append(time.monotonic() - t)
        before = vm_hwm_mb(ctl.pid)
        go_r, go_w = os.pipe()
        endpoint = json.loads((run_dir / "controller.json").read_text())["endpoint"]
        child = attacker(endpoint, args.messages, args.mb * 1024 * 1024, go_r)
        during = []
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            t = time.monotonic()
            client.snapshot()
            during.append(time.monotonic() - t)
            time.sleep(0.05)
        peak = vm_hwm_mb(ctl.pid)
        os.write(go_w, b"x")
        os.waitpid(child, 0)
        client.close()
    finally:
        ctl.terminate()
        ctl.wait(60)
    ms = lambda xs, q: 1000 * sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    print(f"{args.messages} messages of {args.mb} MB without the run's keys, {'as nobody' if os.geteuid() == 0 else 'as this user'}:")
    print(f"  controller peak RSS {before:.0f} MB before -> {peak:.0f} MB after")
    print(f"  state.snapshot round trip: quiet p50 {1000 * statistics.median(quiet):.1f} ms; during the flood p50 "
          f"{1000 * statistics.median(during):.1f} ms, p99 {ms(during, 0.99):.1f} ms, max {1000 * max(during):.1f} ms ({len(during)} requests)")  # fmt: skip


if __name__ == "__main__":
    main()
