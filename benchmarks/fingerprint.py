"""Decision fingerprints of the replay cells the benchmarks run: the safety net of a refactor.

A replay is deterministic (simulated clock, seeded noise), so what the controller decided shows in what came out:
every job's status, samples, stops and rescales, and what the site saw (pilots submitted and cancelled, nodes
released and re-requested). A refactor that changes no decision leaves every fingerprint identical. Record before,
check after::

    PYTHONPATH=. .venv/bin/python benchmarks/fingerprint.py --cells quick --out /tmp/fp-before.json
    PYTHONPATH=. .venv/bin/python benchmarks/fingerprint.py --cells quick --check /tmp/fp-before.json

``quick`` is the 64-node week in both accountings, known and learned curves, queue delays 0 and 30 s, and the typed
machine (aware and blind, known and learned); ``all`` adds the whole machine (slow: tens of minutes). ``--admission
arrival`` replays every cell with first-come-first-served admission (the default before admission by worth: those
fingerprints are the ones recorded before it); BFTrainer's setup is always replayed with it, as its comparison is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from pilotfill.replay import ReplayResult, replay
from pilotfill.traces import parse_time, read_jobs, read_models, read_trace, with_models

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
WINDOW = dict(start=parse_time("2021-02-10T20:21:15Z"), end=parse_time("2021-02-17T00:00:00Z"))
SITE = ("job_starts", "job_stops", "rescales", "pilots_submitted", "pilots_cancelled", "nodes_released", "nodes_rerequested_within_60s",
        "pilots_walltime_ended", "jobs_completed", "jobs_running_at_end", "jobs_waiting_at_end")  # fmt: skip


def fingerprint(r: ReplayResult) -> dict:
    """What the controller decided, as exact values (floats by ``repr``) and one digest of them."""
    jobs = [[j.name, repr(j.admitted), repr(j.finished), repr(j.samples), repr(j.lost), j.rescales, j.preemptions] for j in r.jobs]
    site = {k: getattr(r, k) for k in SITE}
    body = json.dumps({"jobs": jobs, "site": site, "samples": repr(r.samples)}, sort_keys=True)
    return {"digest": hashlib.sha256(body.encode()).hexdigest(), "site": site, "samples": repr(r.samples), "jobs": jobs}


def cells(which: str) -> list[tuple[str, str, dict]]:
    out = []
    machines = ["64"] if which == "quick" else ["64", "whole"]
    for machine in machines:
        for accounting in ("bftrainer", "realistic"):
            for delay in (0.0, 30.0):
                out.append((f"{machine}/{accounting}/q{delay:g}/known", machine, dict(accounting=accounting, queue_delay_s=delay, profiles="known")))
                out.append((f"{machine}/{accounting}/q{delay:g}/learned", machine,
                            dict(accounting=accounting, queue_delay_s=delay, profiles="learned", noise=0.03, seed=0)))  # fmt: skip
        out.append((f"{machine}/realistic/q30/known/tfwd10", machine, dict(accounting="realistic", queue_delay_s=30.0, profiles="known", t_fwd=10.0)))
    out.append(("64/bftrainer-setup", "64", dict(max_jobs=10, t_fwd=10.0, admission="arrival")))
    for types in ("aware", "blind"):
        for profiles in ("known", "learned"):
            out.append((f"typed16/{types}/{profiles}", "typed", dict(accounting="realistic", queue_delay_s=30.0, node_types=types, profiles=profiles)))
    return out


def inputs(machine: str, data: Path):
    week = data / "summit-2021-02-10-week.csv.gz"
    if machine == "typed":
        folder = data / "heterogeneous"
        trace = read_trace(week, types=folder / "node-types-summit.csv", nodes_per_type=16)
        jobs = with_models(read_jobs(folder / "jobs-hetero-train.csv"), read_models(folder / "models.csv"))[:200]
        return trace, jobs
    trace = read_trace(week, nodes=64, **WINDOW) if machine == "64" else read_trace(week)
    return trace, read_jobs(data / "jobs-imagenet-1001.csv")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", choices=("quick", "all"), default="quick")
    ap.add_argument("--only", default="", help="run only cells whose label contains this")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--check", type=Path, help="compare with a recorded file; exit 1 on any difference")
    ap.add_argument("--admission", choices=("worth", "arrival"), help="replay every cell with this admission (default: the controller's)")
    args = ap.parse_args(argv)
    loaded: dict = {}
    got: dict[str, dict] = {}
    for label, machine, options in cells(args.cells):
        if args.only and args.only not in label:
            continue
        if machine not in loaded:
            loaded[machine] = inputs(machine, args.data)
        trace, jobs = loaded[machine]
        t0 = time.perf_counter()
        if args.admission:
            options = {**options, "admission": args.admission}
        got[label] = fingerprint(replay(trace, jobs, keep_timeline=False, **options))
        print(f"{label:<34} {got[label]['digest'][:16]}  samples {float(got[label]['samples']):.6g}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    if args.out:
        args.out.write_text(json.dumps(got, indent=1))
    if args.check:
        want = json.loads(args.check.read_text())
        bad = [label for label in got if label in want and want[label]["digest"] != got[label]["digest"]]
        for label in bad:
            w, g = want[label], got[label]
            diff = {k: (w["site"][k], g["site"][k]) for k in w["site"] if w["site"][k] != g["site"][k]}
            jobs = [(a[0], a[1:], b[1:]) for a, b in zip(w["jobs"], g["jobs"]) if a != b][:3]
            print(f"DIFFERENT {label}: site {diff} samples {w['samples']} -> {g['samples']}; first jobs {jobs}")
        missing = [label for label in got if label not in want]
        print(f"{len(got) - len(bad) - len(missing)} identical, {len(bad)} different, {len(missing)} not recorded")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
