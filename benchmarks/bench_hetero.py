"""Heterogeneous machine benchmark: what node types and the similarity policy are worth, through ``pilotfill replay``.

The data set's typed machine (``shared/data/heterogeneous``: the Summit week with its node-type map, the first
``--nodes-per-type`` nodes of each of V100, P100 and K80) and its 1,000 jobs (Gavel's measured curves per GPU
type), realistic accounting, pilots queued 30 s. Printed, each from a replay run here:

1. type-aware vs type-blind, both with known per-type curves: samples processed and their ratio. Type-blind: the
   controller is told nothing of types; jobs run at their own rate on the type they land on (the slowest type's
   pace on mixed nodes). Target: aware / blind >= 1.2.
2. cold start: for each of the five families, replays whose similarity library (built from ``gpu-throughputs.csv`` by
   ``scripts/gavel_library.py``) leaves that family out; then the families the data set holds out
   (``benchmarks/data/heldout``: Gavel's LM and CycleGAN, 300 jobs, ``--heldout``) among the 1,000 jobs, the library
   all five shared families. Reported per family: its samples / its samples with known curves (the same jobs), with
   the similarity policy as it is (a model whose nearest measured model is less than ``[similarity] far`` = 0.25
   similar is measured once on every type at its minimum size: the cheap exploration), with the policy trusting any
   neighbour (``far = 0``), and learning from nothing (no library), each the median over ``--seeds`` noise seeds (3:
   one seed's noise moves a small family's share by a few per cent), with min and max; beside each family its
   nearest model's similarity (a family no less similar than ``far`` is not far: its two similarity columns are
   the same replays). ``--cold shared,heldout`` picks the parts. Target: >= 0.95 for every family, and above
   nothing. The library does not learn during these replays: held-out models stay held out. ``--control`` adds
   the held-out family learning from nothing while the other families use the library (the same machine and
   competitors as the similarity run).
3. decision time at 1,300 jobs: the typed controller's CPU per pass (p50, p99, max) with known and with learned
   curves (target: max <= 100 ms). The 1,300 jobs are the data set's 1,000 and the 300 held-out ones
   (``--heldout``; ``--extra-jobs FILE`` another job file with a ``models.csv`` beside it).
4. the share objective (``[controller] objective = "share"``, groups = model families) against the samples
   objective, known curves: per family, samples and jobs finished under each, and both against the family's
   *isolated share* — the family alone on 1/G of every type (slice k: every G-th node of each type from the k-th,
   so the G slices partition the machine), what the share objective guarantees it at every decision. Printed: each family's share/isolated and samples/isolated, and the
   total samples share/samples (what the guarantee costs).
5. the ordering on the held-out typed mix (the 1,000 jobs and the 300 held-out ones, known curves): the samples
   objective with admission by worth (the default), the samples objective with first-come-first-served admission
   (BFTrainer's), and the share objective (groups: families), each with its samples, jobs finished, the longest wait
   of any job (for a first start; one never started waits until the end) and the controller's CPU per pass. The
   guard: samples >= every other figure; share at most 3 % below samples.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_hetero.py [--sections aware,cold,time,share,order] [--nodes-per-type 64] [--twice]
        [--families ResNet-18,...] [--seeds 3] [--control] [--heldout FILE] [--extra-jobs FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from gavel_library import build  # noqa: E402

from pilotfill.config import SimilarityConfig  # noqa: E402
from pilotfill.replay import replay  # noqa: E402
from pilotfill.traces import read_jobs, read_models, read_trace, with_models  # noqa: E402

DATA = REPO.parent / "shared" / "data"
HELDOUT = REPO / "benchmarks" / "data" / "heldout" / "jobs-hetero-heldout.csv"
FAMILIES = ("ResNet-18", "ResNet-50", "Transformer", "Recommendation", "A3C")


def family(model: str) -> str:
    return model.rsplit("-bs", 1)[0]


def by_family(result) -> dict[str, float]:
    out: dict[str, float] = {}
    for j in result.jobs:
        out[family(j.model)] = out.get(family(j.model), 0.0) + j.samples
    return out


def run(label: str, trace, jobs, **options):
    t0 = time.perf_counter()
    r = replay(trace, jobs, accounting="realistic", queue_delay_s=30, keep_timeline=False, **options)
    d = r.as_dict()
    print(f"   {label:<34} samples {r.samples:.4g}  completed {r.jobs_completed:>4}  longest wait {r.longest_wait_s / 3600:.1f} h (of those started "
          f"{r.longest_wait_started_s / 3600:.1f} h; to run again {r.longest_rewait_s / 3600:.1f} h; never started {r.jobs_never_started})  solve p99 {d['solve_ms_p99']:6.1f} ms, max {d['solve_ms_max']:6.1f} ms"
          f"  controller CPU per pass p50 {d['controller_cpu_ms_p50']:.1f} p99 {d['controller_cpu_ms_p99']:.1f} max {d['controller_cpu_ms_max']:.1f} ms"
          f"  ({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    return r


def by_family_finished(result) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for j in result.jobs:
        done, n = out.get(family(j.model), (0, 0))
        out[family(j.model)] = (done + (j.finished is not None), n + 1)
    return out


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes-per-type", type=int, default=64)
    ap.add_argument("--twice", action="store_true", help="the machine beside itself (twice the nodes of every type: the next machines)")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--seeds", type=int, default=3, help="noise seeds for learned curves (the median is judged)")
    ap.add_argument("--control", action="store_true", help="also: the held-out family from nothing, the others with the library")
    ap.add_argument("--sections", default="aware,cold,time,share,order", help="which of: aware, cold, time, share, order")
    ap.add_argument("--heldout", type=Path, default=HELDOUT, help="the held-out families' jobs (models.csv beside it)")
    ap.add_argument("--cold", default="shared,heldout", help="section 2's parts: shared (each shared family left out), heldout (the held-out families)")
    ap.add_argument("--extra-jobs", type=Path, help="the 300 more jobs of the decision-time section (models.csv beside it); default: --heldout")
    args = ap.parse_args(argv)
    sections = set(args.sections.split(","))
    folder = DATA / "heterogeneous"
    print(f"python {platform.python_version()}, {os.cpu_count()} CPU(s); data {folder}")
    trace = read_trace(DATA / "summit-2021-02-10-week.csv.gz", types=folder / "node-types-summit.csv", nodes_per_type=args.nodes_per_type)
    if args.twice:
        trace = trace.beside(trace, "b/")
    jobs = with_models(read_jobs(folder / "jobs-hetero-train.csv"), read_models(folder / "models.csv"))
    heldout = with_models(read_jobs(args.heldout), read_models(args.heldout.parent / "models.csv"))
    print(f"{len(trace.nodes)} nodes {trace.type_counts()}, {len(jobs)} jobs, realistic accounting, queue delay 30 s")
    print()
    known = None
    if sections & {"aware", "share"} or ("cold" in sections and "shared" in args.cold.split(",")):
        print("== 1. known per-type curves: type-aware vs type-blind")
        known = run("type-aware, known curves", trace, jobs)
    if "aware" in sections:
        blind = run("type-blind, known curves", trace, jobs, node_types="blind")
        print(f"   aware / blind = {known.samples / blind.samples:.3f}   (target >= 1.2)")
    print()
    if "cold" in sections:
        cold_start(args, folder, trace, jobs, known, heldout)
    if "time" in sections:
        decision_time(folder, trace, jobs, args.extra_jobs or args.heldout)
    if "share" in sections:
        shares(trace, jobs, known)
    if "order" in sections:
        ordering(trace, jobs, heldout)
    return 0


def cold_start(args, folder: Path, trace, jobs, known, heldout) -> None:
    """Section 2: the similarity policy's cold start, with and without the cheap exploration of a far model: each
    shared family left out of the library in turn, then the held-out families among the shared ones."""
    print(f"== 2. cold start: similarity (as it is: a far model measured on every type; trusting any neighbour) vs learning from nothing; "
          f"each / known curves, median of {args.seeds} seeds")  # fmt: skip
    seeds = range(args.seeds)
    rows = []
    parts = set(args.cold.split(","))
    families = [f for f in args.families.split(",") if f] if "shared" in parts else []
    if families:
        nothing = [run(f"learned, no library (from nothing), seed {s}", trace, jobs, profiles="learned", seed=s) for s in seeds]
        for fam in families:
            rows.append(_cold_family(args, folder, trace, jobs, known, nothing, fam, build(folder, {fam})))
    if heldout and "heldout" in parts:
        mix = sorted([*jobs, *heldout], key=lambda j: j.submit_time)
        known_mix = run(f"known curves, with the {len(heldout)} held-out jobs", trace, mix)
        nothing = [run(f"with the held-out jobs, learned, no library, seed {s}", trace, mix, profiles="learned", seed=s) for s in seeds]
        lib = build(folder, set())
        held = sorted({family(j.model) for j in heldout})
        for fam in held:  # one set of replays for all of them: the same jobs, the same library
            rows.append(_cold_family(args, folder, trace, mix, known_mix, nothing, fam, lib, runs=rows[-1][2] if rows and rows[-1][3] else None,
                                     label=", ".join(held)))  # fmt: skip
    print()
    columns = ["similarity", "trusting", "nothing", *(["control"] if args.control else []), "all"]
    titles = {"similarity": "similarity/known", "trusting": "trusting any/known", "nothing": "nothing/known",
              "control": "family cold, others lib/known", "all": "all jobs, similarity/known"}  # fmt: skip
    print(f"   {'held-out family':<16} {'nearest':>7} " + "  ".join(f"{titles[c]:>27}" for c in columns) + "   (median (min-max) of seeds)")
    for fam, row, _, _ in rows:
        print(f"   {fam:<16} {row['nearest']:>7.2f} " + "  ".join(f"{_spread(row[c]):>27}" for c in columns))
    worst = min(statistics.median(row["similarity"]) for _, row, _, _ in rows)
    print(f"   least family, similarity/known: {worst:.3f}   (targets: >= 0.95 and above nothing, per family, on the medians)")
    print()


def _cold_family(args, folder: Path, trace, jobs, known, nothing, fam: str, lib, runs=None, label: str = ""):
    """One family's row: its samples / known with the policy as it is, trusting any neighbour, and from nothing
    (``runs``: the similarity and trusting runs of the same replay, where the library is the same for two families)."""
    seeds = range(args.seeds)
    k_fam = by_family(known)
    where = "library without it" if any(family(j.model) == fam for j in jobs) and fam in FAMILIES else "held out"
    label = label or fam
    model = next(j for j in jobs if family(j.model) == fam)
    nearest = lib.predict(model.descriptor, sorted(trace.type_counts()), model.max_nodes).nearest if model.descriptor else 0.0
    if runs is None:
        sim = [run(f"learned, {where} ({label}), seed {s}", trace, jobs, profiles="learned", seed=s, library=lib) for s in seeds]
        if nearest >= SimilarityConfig.far:  # not a far model: trusting its neighbours is what the policy does, the same replays
            trust = sim
        else:
            trust = [run(f"learned, {where} ({label}), trusting any neighbour, seed {s}", trace, jobs, profiles="learned", seed=s, library=lib, far=0.0)
                     for s in seeds]  # fmt: skip
    else:
        sim, trust = runs
    row = {"similarity": [by_family(r)[fam] / k_fam[fam] for r in sim], "trusting": [by_family(r)[fam] / k_fam[fam] for r in trust],
           "nothing": [by_family(r)[fam] / k_fam[fam] for r in nothing], "all": [r.samples / known.samples for r in sim], "nearest": nearest}  # fmt: skip
    if args.control:  # the family without descriptors: it learns from nothing among the same competitors
        cold = [replace(j, descriptor=None) if family(j.model) == fam else j for j in jobs]
        ctl = [run(f"learned, {where} ({fam}), {fam} from nothing, seed {s}", trace, cold, profiles="learned", seed=s, library=lib) for s in seeds]
        row["control"] = [by_family(r)[fam] / k_fam[fam] for r in ctl]
    return fam, row, (sim, trust), where == "held out"


def decision_time(folder: Path, trace, jobs, extra_jobs: Path) -> None:
    """Section 3: the typed controller's CPU per pass at 1,300 jobs, known and learned curves."""
    more = with_models(read_jobs(extra_jobs), read_models(extra_jobs.parent / "models.csv"))
    mix = sorted([*jobs, *more], key=lambda j: j.submit_time)
    print(f"== 3. decision time, {len(mix)} jobs ({len(jobs)} + {len(more)} of {extra_jobs}); target: controller CPU per pass max <= 100 ms")
    run("type-aware, known curves", trace, mix)
    run("type-aware, learned (library: the shared families)", trace, mix, profiles="learned", seed=0, library=build(folder, set()))
    print()


def shares(trace, jobs, known) -> None:
    """Section 4: the share objective against the samples objective, per family, and each family's isolated share."""
    fams = sorted({family(j.model) for j in jobs})
    print(f"== 4. the share objective (groups: the {len(fams)} model families), known curves, against the samples objective")
    share = run("type-aware, known curves, share", trace, jobs, objective="share", share_by="family")
    G = len(fams)
    isolated = {}
    for k, fam in enumerate(fams):  # family k alone on slice k: every G-th node of each type from the k-th (the slices partition the machine)
        part = trace.only(n for t in sorted(trace.type_counts()) for n in [m for m in trace.nodes if trace.types[m] == t][k::G])
        r = run(f"{fam} alone on its slice ({len(part.nodes)} nodes)", part, [j for j in jobs if family(j.model) == fam])
        isolated[fam] = by_family(r)[fam]
        print(f"      its slice's idle node-hours: {r.idle_node_hours:.0f} ({r.idle_node_hours / (known.idle_node_hours / G):.3f} of 1/{G} of the machine's)")
    s_fam, k_fam = by_family(share), by_family(known)
    s_done, k_done = by_family_finished(share), by_family_finished(known)
    print(f"   {'family':<16} {'isolated share':>15} {'samples obj.':>13} {'/isolated':>10} {'finished':>9} {'share obj.':>13} {'/isolated':>10} {'finished':>9}")
    for fam in fams:
        print(f"   {fam:<16} {isolated[fam]:>15.4g} {k_fam[fam]:>13.4g} {k_fam[fam] / isolated[fam]:>10.3f} {'%d/%d' % k_done[fam]:>9}"
              f" {s_fam[fam]:>13.4g} {s_fam[fam] / isolated[fam]:>10.3f} {'%d/%d' % s_done[fam]:>9}")  # fmt: skip
    worst = min(s_fam[f] / isolated[f] for f in fams), min(k_fam[f] / isolated[f] for f in fams)
    print(f"   least family / its isolated share: share {worst[0]:.3f}, samples {worst[1]:.3f};  total samples, share / samples = {share.samples / known.samples:.3f}")
    print()


def ordering(trace, jobs, heldout) -> None:
    """Section 5: on the held-out typed mix, the samples objective (admission by worth) against arrival admission and
    the share objective: samples >= both, share at most 3 % below."""
    mix = sorted([*jobs, *heldout], key=lambda j: j.submit_time)
    print(f"== 5. ordering, the held-out typed mix ({len(mix)} jobs), known curves: samples objective >= the others; share at most 3 % below")
    worth = run("samples, admission by worth", trace, mix)
    arrival = run("samples, arrival admission", trace, mix, admission="arrival")
    share = run("share (groups: families)", trace, mix, objective="share", share_by="family")
    over = worth.samples / max(arrival.samples, share.samples)
    print(f"   samples objective / the best other {over:.4f} ({'met' if over >= 1 else 'MISSED'}: >= 1); share / samples objective "
          f"{share.samples / worth.samples:.4f} ({'met' if share.samples >= 0.97 * worth.samples else 'MISSED'}: >= 0.97)")  # fmt: skip
    print()


if __name__ == "__main__":
    sys.exit(main())
