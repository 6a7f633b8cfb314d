"""Write the trace excerpt bundled in the package: the first N nodes of a trace, whole window.

    python scripts/make_excerpt.py ../shared/data/summit-2021-02-10-week.csv.gz 64 pilotfill/data/summit-2021-02-10-week-64nodes.csv.gz

The excerpt keeps the trace format (initial block listing its nodes, then
transitions, then the ``end`` row), so ``--nodes 64`` on the full trace and
the excerpt replay identically.
"""

import csv
import gzip
import sys


def main(src: str, n: int, dst: str) -> None:
    with gzip.open(src, "rt", newline="") as f, gzip.open(dst, "wt", newline="", compresslevel=9) as out:
        reader, writer = csv.reader(f), csv.writer(out, lineterminator="\n")
        writer.writerow(next(reader))
        first_time, keep, kept = None, [], set()
        for row in reader:
            t, node, state = row
            if first_time is None:
                first_time = t
            if t == first_time and len(keep) < n and state != "end":
                keep.append(node)
                kept.add(node)
                writer.writerow(row)
                continue
            if t == first_time:
                continue
            if state == "end" or node in kept:
                writer.writerow(row)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
