"""``pilotfill run``'s supervisor restarts a controller that dies — a few deaths in a row end the campaign, deaths far
apart never do (issue: four controller deaths ended a campaign of days, however far apart). Real controller
processes on the embedded local cluster."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from waiting import wait_for

from pilotfill.campaign import prepare_run_dir
from pilotfill.lease import LEASE_FILE
from pilotfill.supervisor import ControllerSupervisor

pytestmark = pytest.mark.local

CONFIG = """scheduler = "local"
[local]
nodes = 1
workload = "none"
[controller]
tick_s = 0.1
"""


def _supervisor(tmp_path, **kwargs) -> ControllerSupervisor:
    config = tmp_path / "c.toml"
    config.write_text(CONFIG)
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
