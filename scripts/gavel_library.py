"""Build a similarity library (pilotfill's JSON) from the heterogeneous data set's measured throughputs.

    .venv/bin/python scripts/gavel_library.py ../shared/data/heterogeneous OUT.json [--exclude FAMILY]

Each (family, batch size) of ``gpu-throughputs.csv`` becomes one measured model: its curve per GPU type
(samples/s at 0, 1, 2, 4, 8 GPUs; a node is one GPU here, as in the data set's job files), its descriptor from
``models.csv`` (the family's row) with its batch size. Entries whose rate is 0 on a type (K80 ResNet-50 bs128 at
2-8 GPUs, recorded as "could not run") keep only the points measured before it. ``--exclude`` leaves a family out.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from pilotfill.allocator import ScalingCurve
from pilotfill.allocator.similarity import Library, Measured
from pilotfill.traces import descriptor_of, read_models


def build(data: Path, exclude: set[str] = frozenset()) -> Library:
    table = read_models(data / "models.csv")
    points: dict[tuple[str, str], dict[str, dict[int, float]]] = {}
    with open(data / "gpu-throughputs.csv", newline="") as f:
        for row in csv.DictReader(f):
            family, bs = row["model"], row["batch_size"]
            if family in exclude:
                continue
            name = f"{family}-bs{bs}" if bs else family
            points.setdefault((family, name), {}).setdefault(row["gpu_type"], {})[int(row["gpus"])] = float(row["samples_per_s"])
    library = Library()
    for (family, name), per_type in sorted(points.items()):
        curves = {}
        for t, pts in per_type.items():
            ns = sorted(pts)
            keep = [0]
            for n in ns:
                if pts[n] <= 0:
                    break
                keep.append(n)
            if len(keep) > 1:
                curves[t] = ScalingCurve(tuple(keep), tuple([0.0] + [pts[n] for n in keep[1:]]))
        descriptor = descriptor_of(name, table)
        library.add(Measured(name, descriptor, curves, family))
    return library


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--exclude", action="append", default=[])
    args = ap.parse_args(argv)
    lib = build(args.data, set(args.exclude))
    lib.save(args.out)
    print(f"{len(lib)} measured models -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
