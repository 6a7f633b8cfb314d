"""Build the held-out heterogeneous data (Gavel's LM and CycleGAN families) from Gavel's measured throughputs.

    python make_heldout.py [OUT_DIR]        (default: this script's folder)

Writes ``gpu-throughputs.csv`` and ``jobs-hetero-heldout.csv``. Deterministic: a re-run reproduces both files byte
for byte. The rules are those of ``shared/data/heterogeneous/README.md``; the same code with that folder's 19 job
types and 1,000 jobs reproduces ``jobs-hetero-train.csv`` byte for byte (checked), so the two files are built alike.
"""

from __future__ import annotations

import csv
import random
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

# Isolated throughputs in steps (iterations) per second: the "null" entry of each key of the consolidated GPU types
# k80/p100/v100, copied in full precision from github.com/stanford-futuredata/gavel, file
# scheduler/oracle_throughputs_v2.json at commit 4605a9cb122a6cfb0964ebfa2c6b29c1b578adbd (the same blob as
# scheduler/simulation_throughputs.json at HEAD c4fa40097339e9608ab71fd64c8bdea96a5e4a4c). Gavel's keys are
# "('LM (batch size 5)', 2)" and "('CycleGAN', 1)": (job type, scale factor = GPUs). Co-location entries and the
# *_unconsolidated types are not used. Indexed here as (family, batch size per GPU) -> GPU type -> GPUs -> steps/s.
STEPS_PER_S: dict[tuple[str, int], dict[str, dict[int, float]]] = {
    ("LM", 5): {
        "k80": {1: 25.485501277170847, 2: 32.38551179103253, 4: 44.08947633248205, 8: 76.86310558968589},
        "p100": {1: 90.77591199634988, 2: 76.92190129668617, 4: 110.21661082949367, 8: 133.5240899561302},
        "v100": {1: 109.16661771207029, 2: 185.72383101933428, 4: 126.71571815404346, 8: 698.773292956699},
    },
    ("LM", 10): {
        "k80": {1: 23.794428965833195, 2: 29.984857868091424, 4: 42.95641711924023, 8: 75.56769495697503},
        "p100": {1: 77.0846780814848, 2: 72.53230564648803, 4: 105.18225815357819, 8: 127.78891069226745},
        "v100": {1: 81.65163491883021, 2: 163.12902048608936, 4: 121.4776195889045, 8: 615.0934647748222},
    },
    ("LM", 20): {
        "k80": {1: 17.142289692304086, 2: 23.773289373427588, 4: 35.70344542111913, 8: 61.44923706594953},
        "p100": {1: 58.17267240669826, 2: 62.33209834747592, 4: 93.81478290324394, 8: 116.64882298424683},
        "v100": {1: 64.74245099960703, 2: 132.17413449742747, 4: 110.99685986392635, 8: 497.2952582330656},
    },
    ("LM", 40): {
        "k80": {1: 11.49965208600937, 2: 16.069669774246478, 4: 22.985588987864023, 8: 43.14645512121931},
        "p100": {1: 35.76638325549232, 2: 48.04183588734964, 4: 76.05171457103407, 8: 102.24830495094295},
        "v100": {1: 45.23737155222392, 2: 91.59265730806288, 4: 96.0312451685392, 8: 359.30692492331696},
    },
    ("LM", 80): {
        "k80": {1: 6.054204218128158, 2: 10.008340130840935, 4: 16.388740436358198, 8: 28.28611005020739},
        "p100": {1: 21.157527655800312, 2: 31.841192000355488, 4: 54.99554190953061, 8: 82.93412253724979},
        "v100": {1: 28.239955054085122, 2: 58.09153801943523, 4: 74.80729601169598, 8: 231.17619885320647},
    },
    ("CycleGAN", 1): {  # batch size 1: cyclegan.py's default; Gavel's job table passes none
        "k80": {1: 0.5047705689725351},
        "p100": {1: 2.4026681703106223},
        "v100": {1: 4.426088263367452},
    },
}
GPU_TYPES = ("k80", "p100", "v100")
SINGLE_BATCH: set[str] = set()  # every held-out model has a batch size (CycleGAN 1): FAMILY-bsN, as the shared README names them

N_JOBS = 300
FIRST_INDEX = 1000  # names T01000..T01299: jobs-hetero-train.csv uses T00000..T00999
SEED = 20210211  # Python's random.Random, as for jobs-hetero-train.csv (20210210 there): the same rules, draws of their own
START = datetime(2021, 2, 10, 20, 21, 15, tzinfo=timezone.utc)  # first and last submit_time (inclusive)
END = datetime(2021, 2, 16, 20, 0, 0, tzinfo=timezone.utc)


def model_name(family: str, batch: int) -> str:
    return family if family in SINGLE_BATCH else f"{family}-bs{batch}"


def write_throughputs(path: Path) -> None:
    """One row per (family, batch size, GPU type, GPUs): steps/s as copied, samples/s = steps/s x batch size."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "batch_size", "gpu_type", "gpus", "iterations_per_s", "samples_per_s"])
        for (family, batch), per_type in STEPS_PER_S.items():
            for gpu in GPU_TYPES:
                for gpus, steps in sorted(per_type[gpu].items()):
                    w.writerow([family, batch, gpu, gpus, steps, steps * batch])


def write_jobs(path: Path) -> None:
    """N_JOBS jobs over the job types in turn (the README's "Job file format" and "Other job-file choices")."""
    types = [t for t, per_type in STEPS_PER_S.items() if all(v > 0 for g in GPU_TYPES for v in per_type[g].values())]
    rng = random.Random(SEED)
    span = (END - START).total_seconds()
    sig6 = "{:.6g}".format
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "model", "submit_time", "min_nodes", "max_nodes", "total_samples", "scale_up_cost_s",
                    "scale_down_cost_s", "nodes", "samples_per_s"] + [f"samples_per_s@{g}" for g in GPU_TYPES])
        for i in range(N_JOBS):
            family, batch = types[i % len(types)]
            per_type = STEPS_PER_S[(family, batch)]
            counts = sorted(per_type["v100"])
            curves = {g: ";".join(["0"] + [sig6(per_type[g][n] * batch) for n in counts]) for g in GPU_TYPES}
            submit = START + timedelta(seconds=round(span * i / (N_JOBS - 1)))
            hours, up, down = rng.uniform(1, 4), rng.uniform(17, 19), rng.uniform(11, 13)
            model = model_name(family, batch)
            w.writerow([f"T{FIRST_INDEX + i:05d}-{model}", model, submit.strftime("%Y-%m-%dT%H:%M:%SZ"), 1, max(counts),
                        round(hours * 3600 * (per_type["v100"][1] * batch)), f"{up:.3f}", f"{down:.3f}",
                        ";".join(str(n) for n in [0, *counts]), curves["v100"]] + [curves[g] for g in GPU_TYPES])


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path(__file__).resolve().parent
    write_throughputs(out / "gpu-throughputs.csv")
    write_jobs(out / "jobs-hetero-heldout.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
