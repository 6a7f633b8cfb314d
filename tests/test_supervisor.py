"""``pilotfill run``'s supervisor restarts a controller that dies — a crash loop ends the campaign, deaths far apart or
with progress between them never do (issues: four controller deaths ended a campaign of days, however far apart; deaths
60 s apart ended a campaign whose trainings went on between them). Real controller processes on the embedded local
cluster."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from localrun import synthetic_job
from waiting import wait_for

from pilotfill.campaign import prepare_run_dir
from pilotfill.client import ControllerClient
from pilotfill.lease import LEASE_FILE
from pilotfill.journal import Journal
from pilotfill.supervisor import ControllerSupervisor

pytestmark = pytest.mark.local

CONFIG = """scheduler = "local"
[local]
nodes = 1
workload = "none"
[controller]
tick_s = 0.1
"""


def _supervisor(tmp_path, config_text: str = CONFIG, **kwargs) -> ControllerSupervisor:
    config = tmp_path / "c.toml"
    config.write_text(config_text)
    run_dir = prepare_run_dir(tmp_path / "runs" / "r")
    return ControllerSupervisor(run_dir, str(config), tmp_path / "runs" / "checkpoints", new_campaign=False, **kwargs)


def _kill_and_wait_for_the_next(sup: ControllerSupervisor) -> None:
    pid = sup.proc.pid
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: sup.fatal is not None or (sup.proc.pid != pid and sup.proc.poll() is None
                                               and json.loads((sup.run_dir / "controller.json").read_text())["pid"] == sup.proc.pid),
             120, "a new controller, or the supervisor giving up")  # fmt: skip


def test_controller_deaths_far_apart_never_end_the_campaign(tmp_path):
    sup = _supervisor(tmp_path, max_restarts=2, healthy_s=2.0)
    sup.start()
    try:
        for _ in range(4):  # more deaths than max_restarts, each after the controller ran well
            time.sleep(2.5)
            _kill_and_wait_for_the_next(sup)
        assert sup.fatal is None
    finally:
        sup.stop()
    assert json.loads((sup.run_dir / LEASE_FILE).read_text())["state"] == "ended"


def test_controller_deaths_in_a_row_end_the_campaign_saying_so(tmp_path):
    sup = _supervisor(tmp_path, max_restarts=2, healthy_s=600.0)
    sup.start()
    try:
        for _ in range(3):
            if sup.fatal is None:
                _kill_and_wait_for_the_next(sup)
        assert sup.fatal is not None and "died 3 times in a row" in sup.fatal, sup.fatal
    finally:
        sup.stop()


TRAINING = CONFIG + '[runtime]\nkind = "processes"\n'


def test_controller_deaths_with_progress_between_them_never_end_the_campaign(tmp_path):
    sup = _supervisor(tmp_path, TRAINING, max_restarts=2, healthy_s=600.0, settled_s=2.0)
    sup.start()
    client = ControllerClient(sup.run_dir, timeout_s=120)
    try:
        job = client.submit(synthetic_job("steady", total=1e9, per_rank=40.0, hi=1))
        for _ in range(4):  # more deaths than max_restarts, each soon after its start, but the training got on under each
            progress, began = client.job(job)["progress"], time.monotonic()
            wait_for(lambda: client.job(job)["progress"] > progress + 40 and time.monotonic() - began > 2.5, 120, "the job to report")
            _kill_and_wait_for_the_next(sup)
            assert sup.fatal is None, sup.fatal
        wait_for(lambda: client.job(job)["progress"] > progress + 80, 120, "the job to report under the last controller")
    finally:
        client.close()
        sup.stop()
    state = Journal(sup.run_dir, readonly=True)
    try:
        started = [e for e in state.events() if e["kind"] == "job.started"]
        stopped = [e["data"]["incarnation"] for e in state.events("controller.stopped")]
    finally:
        state.close()
    assert len(started) == 1  # adopted by each new controller, never restarted
    assert stopped == [5]  # the last controller, restarted by the supervisor's thread, stopped cleanly with the campaign


def test_controller_deaths_right_after_each_start_end_the_campaign_though_adopted_ranks_report(tmp_path):
    sup = _supervisor(tmp_path, TRAINING, max_restarts=2, healthy_s=600.0, settled_s=60.0)
    sup.start()
    client = ControllerClient(sup.run_dir, timeout_s=120)
    try:
        job = client.submit(synthetic_job("steady", total=1e9, per_rank=40.0, hi=1))
        wait_for(lambda: client.job(job)["progress"] > 40, 120, "the job to report")
        for _ in range(3):  # a crash loop: each controller dies soon after its start, whatever its adopted ranks report
            if sup.fatal is None:
                progress = client.job(job)["progress"]
                wait_for(lambda: client.job(job)["progress"] > progress, 120, "the adopted job to report")
                _kill_and_wait_for_the_next(sup)
        assert sup.fatal is not None and "died 3 times in a row" in sup.fatal and "crash loop" in sup.fatal, sup.fatal
    finally:
        client.close()
        sup.stop()
