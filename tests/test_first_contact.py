"""What a newcomer meets first (issue "What users bring": small things): a bad config is its one line alone, with
no progress line before anything has started, in a terminal or piped; counts are said in words ("1 job")."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

import pytest

from pilotfill.progress import AppCounts, Machine, line, plural

pytestmark = pytest.mark.local

CAMPAIGN = """
import pilotfill


@pilotfill.elastic_app(min_nodes=1, max_nodes=1)
def train(x):
    return x

print(train(1).result())
"""
BAD = "[scheduler]\nkind = 'slurm'\npartition = 7\n"


def _write(tmp_path):
    campaign, config = tmp_path / "c.py", tmp_path / "bad.toml"
    campaign.write_text(CAMPAIGN)
    config.write_text(BAD)
    return campaign, config


def test_a_bad_config_is_one_line_with_no_progress_line_before_it(tmp_path):
    campaign, config = _write(tmp_path)
    out = subprocess.run([sys.executable, "-m", "pilotfill", "run", str(campaign), "--config", str(config)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f'error: {config}: scheduler: is a plain key, not a table: write scheduler = "slurm" at the top of the '
                                               "file, before any [table], and its options (partition) under [slurm]"], out.stderr  # fmt: skip
    assert out.stdout == ""


def test_in_a_terminal_no_progress_bar_shows_before_anything_started(tmp_path):
    campaign, config = _write(tmp_path)
    pid, fd = pty.fork()
    if pid == 0:  # the child: pilotfill run in a terminal
        os.chdir(tmp_path)
        os.execv(sys.executable, [sys.executable, "-m", "pilotfill", "run", str(campaign), "--config", str(config)])
    seen = b""
    deadline = time.time() + 120
    while time.time() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    _, status = os.waitpid(pid, 0)
    text = seen.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 2, text
    assert "is a plain key, not a table" in text
    assert "starting the controller" not in text and "training on" not in text and "pilotfill run" not in text, text


def test_counts_are_said_in_words():
    apps, machine = AppCounts(launched=1, done=0), Machine(running=1, nodes=1, rate=12.0)
    assert line(apps, machine) == "0 of 1 app done · 1 job training on 1 node · 12 samples/s"
    apps, machine = AppCounts(launched=3, done=2), Machine(running=2, nodes=0)
    assert line(apps, machine) == "2 of 3 apps done · 2 jobs training on 0 nodes · 0 samples/s"
    assert plural(1, "finished job") == "1 finished job" and plural(1200, "node") == "1,200 nodes"
