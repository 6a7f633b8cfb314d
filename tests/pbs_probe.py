"""The PBS adapter driven call by call against the real OpenPBS, from inside the server host as pilotfill's user.

Run by tests/test_pbs_server.py through ``PbsCluster`` (its network, UTS and user); one scenario per call, its
findings as one JSON line on stdout. Where a scenario needs the main workload to act (a preemption), it prints
``WAIT <what>`` and reads one line from stdin before going on. Only the adapter's public interface and ``qstat``.

    python tests/pbs_probe.py SCENARIO RUN_DIR [CHUNK]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from pilotfill.config import PilotConfig
from pilotfill.schedulers.pbs import JobStatus, PbsConfig, PbsScheduler, load_document, parse_jobs


def adapter(run_dir: Path, chunk: str = "ncpus=1", place: str = "scatter", nodes: int = 3) -> PbsScheduler:
    """The adapter, its pilots running a stand-in for the agent (no controller here): it holds the nodes until SIGTERM."""
    holder = run_dir / "hold"
    holder.write_text("#!/bin/sh\nexec sleep 600\n")
    holder.chmod(0o755)
    config = PbsConfig(queue="scavenger", min_walltime="00:05:00", max_walltime="01:00:00", nodes_per_pilot=nodes, chunk=chunk, place=place,
                       poll_s=0.2, command_timeout_s=30.0, python=str(holder))  # fmt: skip
    return PbsScheduler(config, PilotConfig(), run_dir, retries=1, backoff_s=0.5)


def events_until(s: PbsScheduler, want, timeout_s: float = 90.0) -> list:
    """Poll until an event satisfies ``want``; every event seen."""
    seen = []
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for e in s.poll(time.monotonic()):
            seen.append(e)
            if want(e):
                return seen
        time.sleep(0.2)
    raise TimeoutError(f"no such event within {timeout_s:.0f} s; saw {seen}")


def status(job: str) -> JobStatus | None:
    """What ``qstat`` says of ``job`` now (also with ``-x``: job history may be on); None if it knows nothing."""
    for argv in (["qstat", "-f", "-F", "json", job], ["qstat", "-x", "-f", "-F", "json", job]):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
        try:
            found = parse_jobs(load_document(out)).get(job)
        except ValueError:
            continue
        if found is not None:
            return found
    return None


def until_running(job: str, timeout_s: float = 180.0) -> JobStatus:
    """Wait until ``job`` is R with substate 42 (running): before that — substate 41, its sister MOMs still joining —
    ``pbs_release_nodes`` refuses it (168). The adapter retries that only briefly (a pilot's agents join after it
    anyway); on a busy host the join may take longer than that, and this scenario is about what a release gives
    back, not about the join's timing (``test_pbs.py`` covers the 168 window)."""
    end = time.monotonic() + timeout_s
    found = None
    while time.monotonic() < end:
        found = status(job)
        if found is not None and found.state == "R" and found.substate == 42:
            return found
        time.sleep(0.2)
    raise TimeoutError(f"{job} not running (R, substate 42) within {timeout_s:.0f} s: {found}")


def release(run_dir: Path) -> dict:
    """A pilot with a chunk on each of three hosts: a sister host's vnode is released, the primary host's kept."""
    s = adapter(run_dir)
    job = s.submit_pilot("rel", 3)
    started = events_until(s, lambda e: e.kind == "started")[-1]
    primary = until_running(job).chunk_hosts[0]  # exec_host's first: the primary execution host
    sister = next(n for n in started.nodes if n.split("[")[0] != primary)
    on_primary = next(n for n in started.nodes if n.split("[")[0] == primary)
    released = s.release("rel", [sister])
    after = status(job)
    kept = s.release("rel", [on_primary])
    s.cancel("rel")
    ended = events_until(s, lambda e: e.kind == "ended")
    s.close()
    return {"nodes": list(started.nodes), "primary": primary, "sister": sister, "released": released, "held_after": list(after.vnodes),
            "primary_vnode": on_primary, "released_primary": kept, "ended": [e.kind for e in ended]}  # fmt: skip


def requeue_delete(run_dir: Path, chunk: str) -> dict:
    """A pilot preempted (requeued) by a main job, deleted while PBS requeues it: it never runs again (turn 4 (c))."""
    s = adapter(run_dir, chunk=chunk, place="free", nodes=1)
    job = s.submit_pilot("rq", 1)
    seen = events_until(s, lambda e: e.kind == "started")
    print(f"WAIT preempt {job}", flush=True)
    sys.stdin.readline()
    seen += events_until(s, lambda e: e.kind == "ended")
    s.cancel("rq")  # while PBS requeues it: this qdel may be lost
    end = time.monotonic() + 90
    final = status(job)
    while time.monotonic() < end and final is not None and not final.finished:  # until PBS has forgotten or finished it
        seen += s.poll(time.monotonic())
        time.sleep(0.2)
        final = status(job)
    s.close()
    return {"job": job, "events": [[e.kind, e.detail] for e in seen],
            "final": None if final is None else {"state": final.state, "run_count": final.run_count}}  # fmt: skip


def main() -> int:
    scenario, run_dir = sys.argv[1], Path(sys.argv[2])
    run_dir.mkdir(parents=True, exist_ok=True)
    if scenario == "release":
        found = release(run_dir)
    elif scenario == "requeue-delete":
        found = requeue_delete(run_dir, sys.argv[3])
    else:
        raise SystemExit(f"no scenario {scenario!r}")
    print(json.dumps(found), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
