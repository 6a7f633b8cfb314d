"""The controller's CPU per pass at two commits, measured in one run: is a refactor's loop any slower?

A replay cell is run alternately with the code of ``--before`` (a git worktree made for it) and of this checkout,
each in a fresh process, ``--rounds`` times; printed: CPU per pass of the controller's loop (p50, p99, max; the
process's CPU time, what the controller costs on a shared machine) for each, the ratios after / before of the
medians over rounds, and whether the decisions were the same (the cell's fingerprint)::

    python benchmarks/compare_commits.py --before 86cea53 [--cell 64/realistic/q30/learned] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"

ONE = """
import json, sys
sys.path.insert(0, {bench!r})
from fingerprint import cells, fingerprint, inputs
from pathlib import Path
from pilotfill.replay import replay
label, machine, options = next(c for c in cells("quick") if c[0] == {cell!r})
trace, jobs = inputs(machine, Path({data!r}))
r = replay(trace, jobs, keep_timeline=False, **options)
d = r.as_dict()
print(json.dumps({{"digest": fingerprint(r)["digest"], "p50": d["controller_cpu_ms_p50"], "p99": d["controller_cpu_ms_p99"], "max": d["controller_cpu_ms_max"]}}))
"""


def run(tree: Path, cell: str, data: Path) -> dict:
    code = ONE.format(bench=str(REPO / "benchmarks"), cell=cell, data=str(data))
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})
    if out.returncode:
        raise SystemExit(f"{tree}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="a commit")
    ap.add_argument("--cell", default="64/realistic/q30/learned", help="a cell of benchmarks/fingerprint.py")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data", type=Path, default=DATA)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(before), args.before], cwd=REPO, check=True, capture_output=True)
        try:
            got: dict[str, list[dict]] = {"before": [], "after": []}
            for i in range(args.rounds):
                for name, tree in (("before", before), ("after", REPO)) if i % 2 == 0 else (("after", REPO), ("before", before)):
                    got[name].append(run(tree, args.cell, args.data))
                    r = got[name][-1]
                    print(f"round {i + 1} {name:<6} CPU ms per pass p50 {r['p50']:6.2f}  p99 {r['p99']:7.2f}  max {r['max']:7.2f}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=REPO, capture_output=True)
    print(f"{args.cell}, {args.rounds} rounds, before {args.before}:")
    for q in ("p50", "p99", "max"):
        b, a = statistics.median(r[q] for r in got["before"]), statistics.median(r[q] for r in got["after"])
        print(f"  CPU per pass {q:<4} before {b:7.2f} ms  after {a:7.2f} ms  after/before {a / b if b else float('nan'):.3f}")
    same = {r["digest"] for r in got["before"] + got["after"]}
    print(f"  decisions: {'identical' if len(same) == 1 else 'DIFFERENT'} ({len(same)} fingerprint(s))")
    return 0 if len(same) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
