"""Shared fixtures: small trace and job files written on the fly, and the shared data when present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SHARED = Path(os.environ.get("PILOTFILL_SHARED_DATA", HERE.parent.parent / "shared" / "data"))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture
def shared_data() -> Path:
    """The repository's ``shared/data`` (beside the checkout). Required in CI, skipped on a laptop without it."""
    if not (SHARED / "summit-2021-02-10-week.csv.gz").exists():
        if IN_CI:
            pytest.fail(f"CI needs the shared data at {SHARED} (set PILOTFILL_SHARED_DATA)")
        pytest.skip(f"shared data not found at {SHARED} (set PILOTFILL_SHARED_DATA)")
    return SHARED


JOB_HEADER = "name,model,submit_time,min_nodes,max_nodes,total_samples,scale_up_cost_s,scale_down_cost_s,nodes,samples_per_s"


@pytest.fixture
def write(tmp_path):
    """write(name, text) -> path of a file in tmp_path with that text."""

    def _write(name: str, text: str) -> Path:
        p = tmp_path / name
        p.write_text(text.lstrip("\n"))
        return p

    return _write


@pytest.fixture
def horovod():
    """Elastic Horovod with PyTorch and Gloo. Required in CI; skipped on a laptop without it."""
    try:
        import horovod.torch  # noqa: F401
        import sklearn  # noqa: F401
    except ImportError as exc:
        if IN_CI:
            pytest.fail(f"CI needs Horovod (make install builds it): {exc}")
        pytest.skip(f"Horovod with PyTorch is not installed ({exc}); `make install` builds it")


@pytest.fixture
def slurm(tmp_path_factory):
    """A real Slurm (slurmctld + four slurmd) on this machine. Required in CI; skipped on a laptop without it."""
    from slurm_cluster import SlurmCluster, available

    if not available():
        if IN_CI:
            pytest.fail("CI needs Slurm (apt-get install slurm-wlm; .ci/run does it)")
        pytest.skip("Slurm is not installed (apt-get install slurm-wlm)")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    cluster.start()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        cluster.stop()
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        assert cluster.daemons_running() == [], "Slurm daemons left running"
