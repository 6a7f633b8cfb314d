"""A pilot's warm zygote (pilotfill/pilots/warm.py): what it forked outlives a SIGTERM sent to every process of the job."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time

import pytest
from waiting import wait_for

from pilotfill import procs
from pilotfill.pilots.warm import Zygote

pytestmark = pytest.mark.local


def test_what_the_zygote_forked_outlives_a_sigterm_to_every_process_of_the_job(tmp_path, torch_runtime):
    """Slurm preempts a job by signalling every process in it, not only its top one. The zygote went at SIGTERM, and
    the torch agents it forked died with it (``PR_SET_PDEATHSIG``): their workers were killed in the middle of a step
    instead of leaving at the next boundary, and every survivor on the other nodes restarted from its last commit (the
    real Slurm: 9 workers restarted, 640 samples redone in three preemptions). The zygote now stays until the pilot's
    agent goes; what it forked gets its grace, and still dies with it."""
    (tmp_path / "sleeper.py").write_text(textwrap.dedent("""
        import signal, sys, time
        def main(argv):
            signal.signal(signal.SIGTERM, lambda *_: print("told to go", flush=True))  # leaves at its own pace
            print("running", flush=True)
            time.sleep(600)
            return 0
    """))
    zygote = Zygote.start(str(tmp_path / "zygote.log"), tmp_path)
    try:
        wait_for(zygote.ready, 300, "the zygote's imports")
        child = zygote.spawn([sys.executable, "-m", "sleeper"], {**os.environ, "PYTHONPATH": str(tmp_path)}, str(tmp_path / "child.log"), 1 << 20)
        wait_for(lambda: "running" in (tmp_path / "child.log").read_text(errors="replace") if (tmp_path / "child.log").exists() else False,
                 120, "the forked child to run")  # fmt: skip
        for pid in (zygote.proc.pid, child.pid):  # as slurmstepd does: every process of the job at once
            os.kill(pid, signal.SIGTERM)
        wait_for(lambda: "told to go" in (tmp_path / "child.log").read_text(errors="replace"), 60, "the child to hear the SIGTERM")
        time.sleep(1.0)
        assert zygote.proc.poll() is None, "the zygote went at SIGTERM"
        assert child.poll() is None and procs.alive(child.pid), "the child went with the zygote before its grace"
    finally:
        zygote.close()  # as when the pilot's agent goes: the zygote, and what it forked with it
    wait_for(lambda: not procs.alive(child.pid), 60, "the child to die with the zygote")
