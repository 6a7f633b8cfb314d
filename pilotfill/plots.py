"""Figures (matplotlib, headless)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402


def plot_replay(result, path: str | Path) -> Path:
    """Idle nodes and nodes used by training over the replay window, as steps."""
    snaps = result.timeline
    path = Path(path)
    times = [datetime.fromtimestamp(s.time, tz=timezone.utc) for s in snaps]
    fig, ax = plt.subplots(figsize=(11, 4), dpi=110)
    ax.step(
        times,
        [s.idle for s in snaps],
        where="post",
        label="idle nodes (available to pilots)",
        color="#9aa5b1",
        linewidth=1,
    )
    ax.fill_between(
        times, [s.used for s in snaps], step="post", label="nodes used by training", color="#2b8a3e", alpha=0.7
    )
    ax.set_ylabel("nodes")
    ax.set_title(
        f"{Path(result.trace).name}: {result.nodes} nodes, {result.jobs_completed} jobs completed, "
        f"{result.samples:.3g} samples, efficiency {100 * result.efficiency:.1f}%"
    )
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))
    ax.legend(loc="upper right")
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
