"""What a job learns under churn, and what the elastic loader costs (issue 55), side by side in one run.

1. **The NAS campaign's leaderboard with nodes held still and under churn**: ``workflows/nas_campaign.py`` run by
   ``pilotfill run`` twice on the local cluster — once with ``configs/local.toml`` (the main workload takes
   pf-node-1 back 20 s in and returns it 40 s later: jobs on it shrink and grow mid-epoch) and once with the same
   config and no main workload — each architecture's validation accuracy in both, and how far apart they are. With
   the elastic loader (global batch 32 whatever the nodes) they agree; before it, a job's effective batch and steps
   per epoch followed its nodes.
2. **The loader's cost per step against a plain ``DataLoader``**: the digits MLP trained a step at a time, its batches
   from ``torch.utils.data.DataLoader(dataset, batch_size, shuffle=True)`` or from ``ElasticLoader(dataset,
   global_batch)`` (one rank), the same map-style dataset through the same fetch path, a step of one then a step of
   the other (a busy machine slows both alike): the median step, and the time per sample with epochs' starts included.
   Also the data alone (no training step), and the loader on tensors (fetched a batch at a time) against
   ``DataLoader(TensorDataset)``.

    python benchmarks/bench_loader.py [--epochs 6] [--lr 0.05] [--only all|nas|cost] [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ 1. the leaderboard, held still and churned


def _nas(config: Path, where: Path, epochs: int, lr: float) -> tuple[list[dict], dict, float]:
    """One run of the NAS campaign: its leaderboard, what the controller saw (resizes, stops), and its seconds."""
    from pilotfill.journal import Journal

    campaign = where / "nas_campaign.py"
    shutil.copy(REPO / "workflows" / "nas_campaign.py", campaign)
    results, run_dir = where / "board.json", where / "run"
    env = {**os.environ, "NAS_RESULTS": str(results), "NAS_EPOCHS": str(epochs), "NAS_LR": str(lr), "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pilotfill", "run", str(campaign), "--config", str(config), "--run-dir", str(run_dir), "--quiet"],
                          cwd=where, env=env, capture_output=True, text=True, timeout=3600)  # fmt: skip
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"pilotfill run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    state = Journal(run_dir, readonly=True)
    try:
        events, jobs = state.events(), state.jobs()
    finally:
        state.close()
    seen = {
        "resizes": sum(e["kind"] == "job.resized" and e["data"]["before"] > 0 and e["data"]["after"] > 0 for e in events),
        "stops": sum(e["kind"] == "job.stopped" for e in events),
        "samples": sum(j.progress for j in jobs),
        "redone": sum(j.redone for j in jobs),
    }
    return json.loads(results.read_text()), seen, took


def leaderboards(epochs: int, lr: float) -> None:
    churn = REPO / "configs" / "local.toml"
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        root = Path(tmp)
        still = root / "still.toml"
        text = churn.read_text()
        still.write_text(text.replace('workload = "script"', 'workload = "none"'))  # the same cluster, nobody taking nodes
        boards = {}
        for name, config in (("held still", still), ("under churn", churn)):
            (root / name.replace(" ", "-")).mkdir()
            boards[name] = _nas(config, root / name.replace(" ", "-"), epochs, lr)
    arch = lambda r: (r["depth"], r["width"], r["activation"])  # noqa: E731
    still_acc = {arch(r): r["val_accuracy"] for r in boards["held still"][0]}
    churn_acc = {arch(r): r["val_accuracy"] for r in boards["under churn"][0]}
    print(f"NAS campaign (workflows/nas_campaign.py, {epochs} epochs, lr {lr}, global batch 32; Elastic Horovod, configs/local.toml's cluster)")
    print(f"  {'depth':>5} {'width':>5} {'activation':<10} {'held still':>10} {'under churn':>11} {'difference':>10}")
    for a in sorted(still_acc, key=lambda a: -still_acc[a]):
        print(f"  {a[0]:>5} {a[1]:>5} {a[2]:<10} {still_acc[a]:>10.4f} {churn_acc[a]:>11.4f} {churn_acc[a] - still_acc[a]:>+10.4f}")
    worst = max(abs(churn_acc[a] - still_acc[a]) for a in still_acc)
    same_order = [arch(r) for r in boards["held still"][0]] == [arch(r) for r in boards["under churn"][0]]
    print(f"  largest difference {worst:.4f}; the same ranking: {'yes' if same_order else 'no'}")
    for name, (_, seen, took) in boards.items():
        print(f"  {name}: {seen['resizes']} resizes, {seen['stops']} stops, {seen['samples']:,.0f} samples counted, {seen['redone']:,.0f} redone; {took:.0f} s")


# ------------------------------------------------------------------ 2. the loader's cost per step


def cost(rounds: int, steps: int, batch: int) -> None:
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, Dataset, TensorDataset

    from pilotfill.elastic import ElasticLoader
    from pilotfill.workloads.digits import data, make_model

    torch.set_num_threads(1)
    xtr, ytr, _, _ = data(0)

    class Digits(Dataset):
        """A map-style dataset as users write them (one sample per index)."""

        def __len__(self) -> int:
            return len(xtr)

        def __getitem__(self, i: int):
            return xtr[i], ytr[i]

    def plain(dataset) -> DataLoader:
        return DataLoader(dataset, batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(0))

    def elastic(dataset) -> ElasticLoader:
        return ElasticLoader(dataset, global_batch=batch, seed=0)

    model = make_model(2, 64, "relu")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def train_plain(x, y) -> None:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def steps_of(loader, train: bool):
        """One step at a time, for ever: fetch (and train on) a batch."""
        while True:
            for item in loader:
                if isinstance(loader, ElasticLoader):
                    if train:
                        opt.zero_grad()
                        item.backward(lambda x, y: F.cross_entropy(model(x), y), model)
                        opt.step()
                    else:
                        item.data  # noqa: B018 - what the step would read
                elif train:
                    train_plain(*item)
                yield item.size if isinstance(loader, ElasticLoader) else len(item[0])

    cases = [("map-style dataset, training step", Digits(), True), ("map-style dataset, data only", Digits(), False),
             ("tensors, training step", TensorDataset(xtr, ytr), True)]  # fmt: skip
    print(f"\nThe loader's cost per step (digits MLP, batch {batch}, one rank; {rounds} x {steps} steps of each, one of one then one of the "
          f"other, so that whatever else the machine runs slows both alike). The median step; and the time per sample, epochs' starts "
          f"included (DataLoader ends an epoch with a short batch, ElasticLoader folds those samples into its last one)")  # fmt: skip
    print(f"  {'':<34} {'median step: DataLoader':>24} {'ElasticLoader':>14} {'ratio':>7}   {'per sample':>11} {'':>10} {'ratio':>7}")
    for name, dataset, train in cases:
        times: dict[str, list[float]] = {"plain": [], "elastic": []}
        samples = {"plain": 0, "elastic": 0}
        for _ in range(rounds):
            runs = {"plain": steps_of(plain(dataset), train), "elastic": steps_of(elastic(dataset), train)}
            for _ in range(steps):
                for kind, run in runs.items():
                    t0 = time.perf_counter()
                    samples[kind] += next(run)
                    times[kind].append(time.perf_counter() - t0)
        pm, em = statistics.median(times["plain"]), statistics.median(times["elastic"])
        ps, es = sum(times["plain"]) / samples["plain"], sum(times["elastic"]) / samples["elastic"]
        print(f"  {name:<34} {pm * 1e6:>21.0f} µs {em * 1e6:>11.0f} µs {em / pm:>7.3f}   {ps * 1e6:>8.2f} µs {es * 1e6:>7.2f} µs {es / ps:>7.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=6, help="the NAS campaign's epochs (NAS_EPOCHS)")
    ap.add_argument("--lr", type=float, default=0.05, help="the NAS campaign's learning rate (NAS_LR)")
    ap.add_argument("--only", choices=["all", "nas", "cost"], default="all")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args(argv)
    if args.only in ("all", "nas"):
        leaderboards(args.epochs, args.lr)
    if args.only in ("all", "cost"):
        cost(args.rounds, args.steps, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
