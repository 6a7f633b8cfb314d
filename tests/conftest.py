"""Shared fixtures: small trace and job files written on the fly, and the shared data when present."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SHARED = Path(os.environ.get("PILOTFILL_SHARED_DATA", HERE.parent.parent / "shared" / "data"))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
os.environ.setdefault("PILOTFILL_VALIDATE", "1")  # every controller in the tests checks its world after every step


@pytest.fixture
def shared_data() -> Path:
    """The repository's ``shared/data`` (beside the checkout). Required in CI, skipped on a laptop without it."""
    if not (SHARED / "summit-2021-02-10-week.csv.gz").exists():
        if IN_CI:
            pytest.fail(f"CI needs the shared data at {SHARED} (set PILOTFILL_SHARED_DATA)")
        pytest.skip(f"shared data not found at {SHARED} (set PILOTFILL_SHARED_DATA)")
    return SHARED


JOB_HEADER = "name,model,submit_time,min_nodes,max_nodes,total_samples,scale_up_cost_s,scale_down_cost_s,nodes,samples_per_s"


TIERS = {
    "unit": "in-process: the allocator, the controller's decisions, replays, parsers (`make test-fast`, under a minute)",
    "local": "real processes on the local virtual cluster: the controller, pilots, torch and Horovod ranks, the CLI",
    "site": "a real batch system or terminal started by the tests: Slurm, OpenPBS, tmux; root, namespaces",
}
SITE_FIXTURES = {"slurm", "slurm_hosts", "pbs_server", "tmux"}
"""Fixtures that start a real batch system or terminal: a test using one is in the site tier."""
PROCESS_FIXTURES = {"local", "pbs", "typed_pbs", "torch_runtime"}
"""Fixtures that start real processes: a test using one is not in the unit tier."""


def pytest_addoption(parser):
    parser.addoption("--tier", choices=sorted(TIERS), action="append", help="run only the tests of this tier (again for more)")


def pytest_configure(config):
    config.addinivalue_line("markers", "slurm_conf(**settings): slurm.conf settings for the `slurm` fixture (see SlurmCluster)")
    for name, what in TIERS.items():
        config.addinivalue_line("markers", f"{name}: tier, {what}")
    config.addinivalue_line("markers", "slow: an in-process test of more than a few seconds (a week's replay): not in `make test-fast`")


def tier_of(item) -> str | None:
    """The closest tier marker: the test's own, else its class's, else its module's ``pytestmark``."""
    return next((m.name for m in item.iter_markers() if m.name in TIERS), None)


def pytest_itemcollected(item):
    """Under pytest-xdist (`make test`) every site test goes to one worker, one after another: one real batch system
    at a time (the site tests share users, ports and PostgreSQL's socket directory). Marked here, as each item is
    collected: pytest-xdist reads the ``xdist_group`` marks in a collection hook of its own."""
    if tier_of(item) == "site":
        item.add_marker(pytest.mark.xdist_group("site"))


def pytest_collection_modifyitems(config, items):
    """Every test is in one tier; one with none, or in a lighter tier than a fixture it uses, fails collection
    (tiers that lie would make ``--tier unit`` start Slurm). ``--tier`` keeps the tests of the tiers named."""
    wrong, keep, drop = [], [], []
    for item in items:
        tier, fixtures = tier_of(item), set(getattr(item, "fixturenames", ()))
        if tier is None:
            wrong.append(f"{item.nodeid}: no tier (mark it, or its module, with one of {', '.join(TIERS)})")
        elif SITE_FIXTURES & fixtures and tier != "site":
            wrong.append(f"{item.nodeid}: uses {', '.join(sorted(SITE_FIXTURES & fixtures))} but is marked {tier}")
        elif PROCESS_FIXTURES & fixtures and tier == "unit":
            wrong.append(f"{item.nodeid}: starts processes ({', '.join(sorted(PROCESS_FIXTURES & fixtures))}) but is marked unit")
        (keep if not config.getoption("tier") or tier in config.getoption("tier") else drop).append(item)
    if wrong:
        raise pytest.UsageError("tests without a true tier:\n  " + "\n  ".join(wrong))
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    # The site tests first, then the slow ones (a stable sort): under xdist the site tests' one worker and a week's
    # replay are the longest runs, so they start at once, in workers of their own; the rest fill in around them.
    items.sort(key=lambda item: (tier_of(item) != "site", item.get_closest_marker("slow") is None))


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
def torch_runtime():
    """PyTorch with torch.distributed (gloo) and scikit-learn, for the torch runtime. Required in CI; skipped without them."""
    try:
        import sklearn  # noqa: F401
        import torch.distributed

        if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
            raise ImportError("this torch has no torch.distributed with gloo")
    except ImportError as exc:
        if IN_CI:
            pytest.fail(f"CI needs torch with gloo and scikit-learn (make install): {exc}")
        pytest.skip(f"torch with gloo is not installed ({exc}); `make install` installs it")


@pytest.fixture
def slurm(request, tmp_path_factory):
    """A real Slurm (slurmctld + four slurmd) on this machine. Required in CI; skipped on a laptop without it.

    ``@pytest.mark.slurm_conf(min_job_age=2, extra="JobSubmitPlugins=throttle", scheduler_parameters="…")``
    changes its slurm.conf for one test."""
    from slurm_cluster import SlurmCluster, available

    if not available():
        if IN_CI:
            pytest.fail("CI needs Slurm (apt-get install slurm-wlm; .ci/run does it)")
        pytest.skip("Slurm is not installed (apt-get install slurm-wlm)")
    marker = request.node.get_closest_marker("slurm_conf")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), **(marker.kwargs if marker else {}))
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


@pytest.fixture
def slurm_hosts(tmp_path_factory):
    """A real Slurm whose slurmctld and four slurmd each run on a host of their own (network and UTS namespaces:
    hostnames node1…node4, their own addresses; tests/vhosts.py): commands and campaigns run on the control host
    ``pfctl`` (``cluster.command``, ``cluster.popen``). Required in CI; skipped on a laptop without Slurm or root."""
    from slurm_cluster import SlurmCluster, available
    from vhosts import missing

    why = None if available() else "Slurm is not installed (apt-get install slurm-wlm)"
    why = why or missing()
    if why:
        if IN_CI:
            pytest.fail(f"CI needs Slurm on hosts of their own: {why}")
        pytest.skip(why)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm-hosts"), hosts=True)
    try:
        cluster.start(timeout_s=60)
        yield cluster
    finally:
        cluster.stop()
        assert cluster.daemons_running() == [], "Slurm daemons left running"


PBS_STANDIN = HERE / "pbs_standin"


class PbsStandin:
    """The stand-in OpenPBS of one test (OpenPBS is not packaged here; see tests/pbs_standin/_standin.py):
    run its commands, read its state (what each command received)."""

    def __init__(self, state: Path, history: bool):
        self.path, self.history = state, history

    def __call__(self, *argv: str, check: bool = True):
        # From the test's own folder: a job's default output file lands in the submitting directory, as with qsub.
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, cwd=self.path.parent)
        if check and proc.returncode != 0:
            raise AssertionError(f"{argv} exited {proc.returncode}: {proc.stderr}")
        return proc

    def state(self) -> dict:
        return json.loads(self.path.read_text())

    def calls(self, cmd: str) -> list[list[str]]:
        return [c["argv"] for c in self.state()["calls"] if c["cmd"] == cmd]

    def job(self, jid: str) -> dict:
        return json.loads(self("qstat", "-f", "-F", "json", jid).stdout)["Jobs"][jid]

    def jobs(self) -> dict:
        """Every job qstat lists (no -x: the live ones)."""
        return json.loads(self("qstat", "-f", "-F", "json").stdout).get("Jobs", {})

    def vnode(self, name: str) -> dict:
        return json.loads(self("pbsnodes", "-av", "-F", "json").stdout)["nodes"][name]


@pytest.fixture(params=[False, True], ids=["history-off", "history-on"])
def pbs(request, tmp_path, monkeypatch) -> PbsStandin:
    """The stand-in OpenPBS first on PATH (with this interpreter as its ``python3``), its state in tmp_path, with job
    history off (the real server's default) or on: every PBS test runs both ways. Job scripts do not run unless a
    test says ``pbs_standin exec on``; every job process left is killed at the end."""
    monkeypatch.setenv("PATH", os.pathsep.join([str(PBS_STANDIN), str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    monkeypatch.setenv("PBS_STANDIN_STATE", str(tmp_path / "pbs-state.json"))
    monkeypatch.delenv("PBS_JOBID", raising=False)
    standin = PbsStandin(tmp_path / "pbs-state.json", request.param)
    standin("pbs_standin", "history", "on" if request.param else "off")
    yield standin
    standin("pbs_standin", "killall", check=False)


@pytest.fixture
def local(tmp_path):
    """make(**LocalRun options) -> a LocalRun (a real controller on the local cluster); at the end each is stopped
    and must leave no process behind."""
    from localrun import LocalRun

    runs: list = []

    def make(**kw):
        runs.append(LocalRun(tmp_path, **kw))
        return runs[-1]

    yield make
    for run in runs:
        run.stop()
        run.wait_for(lambda: not run.leftover_processes(), 30, "no leftover processes")  # raises, naming each one left
        assert run.leftover_processes() == []


@pytest.fixture(scope="session")
def pbs_server():
    """A real OpenPBS 23.06.06 (server, scheduler, comm, PostgreSQL datastore, three MOM hosts each in its own network
    and UTS namespace; tests/pbs_cluster.py), built once from ../shared/vendor/openpbs. One per test session: each test
    takes it through ``real_pbs``. Required in CI; skipped on a laptop that cannot run it (no root, no source, no
    PostgreSQL), with the reason."""
    from pbs_cluster import PbsCluster, build, unavailable

    why = unavailable()
    if why:
        if IN_CI:
            pytest.fail(f"CI needs the real OpenPBS: {why}")
        pytest.skip(f"no real OpenPBS here: {why}")
    cluster = PbsCluster(build())
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def real_pbs(pbs_server):
    """The session's real OpenPBS, with no job left, every vnode free and job history off (the server's default)."""
    pbs_server.reset()
    yield pbs_server
