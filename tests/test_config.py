"""Configs: the embedded default loads from anywhere; every mistake names the file and the key."""

from __future__ import annotations

import pytest

from pilotfill.config import ConfigError, load_config

pytestmark = pytest.mark.unit


def test_embedded_default_is_a_four_node_local_cluster(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config()
    assert config.scheduler == "local"
    assert config.local.nodes == 4 and config.local.workload == "trace"
    assert load_config("local") == config


@pytest.mark.parametrize(
    "text, where",
    [
        ("schedular = 'local'", "schedular: unknown key"),
        ("scheduler = 'lsf'", "scheduler: 'lsf' is not one of"),
        ("[local]\nnodes = 'four'", "local.nodes: expected int"),
        ("[local]\nnodes = 0", "local.nodes: must be positive"),
        ("[pilots]\nheartbeat_s = 2.0\nheartbeat_deadline_s = 1.0", "pilots.heartbeat_deadline_s: must be longer"),
        ("[local]\nworkload = 'script'\nscript = [{ at = 1, node = 'pf-node-9', state = 'busy' }]", "local.script[0].node"),
        ("[local]\nscript = [{ at = 1, node = 'pf-node-0', state = 'asleep' }]", "local.script[0]: state must be"),
        ("[controller]\ntick = 1", "controller.tick: unknown key"),
        ("[runtime]\nkind = 'mpi'", "runtime.kind: 'mpi'"),
        ("[local\nnodes = 4", "not valid TOML"),
        ("scheduler = 'slurm'\n[slurm]\ntime_min = '03:00:00'\ntime_max = '02:00:00'", "slurm.time_min: 03:00:00 is longer than slurm.time_max"),
        ("scheduler = 'slurm'\n[slurm]\ntime_max = 'two hours'", "slurm.time_max: 'two hours' is not a duration"),
        ("scheduler = 'slurm'\n[slurm]\nmin_nodes = 4\nmax_nodes = 2", "slurm.min_nodes: 4 > slurm.max_nodes 2"),
        ("scheduler = 'slurm'\n[slurm]\npartition = ''", "slurm.partition: must not be empty"),
        ("scheduler = 'slurm'\n[slurm]\nextra_args = '--exclusive'", "slurm.extra_args: expected a list of strings"),
        ("scheduler = 'pbs'\n[pbs]\nmin_walltime = '05:00:00'\nmax_walltime = '01:00:00'", "pbs.min_walltime: 05:00:00 is longer than pbs.max_walltime"),
        ("scheduler = 'pbs'\n[pbs]\nqueue = 7", "pbs.queue: expected str"),
        ("[pilots]\nmax_queued_pilots = 0", "pilots.max_queued_pilots: must be positive"),
        ("[pilots]\nmax_submits_per_minute = 2.5", "pilots.max_submits_per_minute: expected int"),
        ("[controller]\nformulation = 'node-level'", "controller.formulation: 'node-level' is not one of"),
        ("[controller]\nobjective = 'fair'", "controller.objective: 'fair' is not one of samples, share"),
        ("[controller]\nobjective = 'share'\nformulation = 'greedy'", "controller.objective: \"share\" is solved by the exact aggregated solvers"),
        ("[runtime]\nranks_per_node = 0", "runtime.ranks_per_node: must be positive"),
        ("[runtime]\ngpus_per_node = -1", "runtime.gpus_per_node: must be zero or more"),
        ("[local]\npilot_walltime_s = -5", "local.pilot_walltime_s: must be zero or more"),
        ("[runtime]\ncollective_timeout_s = 0", "runtime.collective_timeout_s: must be positive"),
        # Values that validated and then broke (issue "Nothing an app or a value does relaunches a job for ever").
        ("[controller]\ntick_s = 1e12", "controller.tick_s: must be between 0.01 and 60"),
        ("[pilots]\nheartbeat_s = 1e-6", "pilots.heartbeat_s: must be between 0.05 and 600"),
        ("[local]\npilot_walltime_s = 1", "local.pilot_walltime_s: 1 s cannot work: a pilot's nodes are drained"),
        ("[local]\npilot_walltime_s = 8\n[pilots]\ngrace_s = 5", "local.pilot_walltime_s: 8 s cannot work: a pilot's nodes are drained pilots.grace_s + 2 s = 7 s before its walltime ends, which leaves 1 s to train"),
        ("scheduler = 'pbs'\n[pbs]\nmin_walltime = '00:00:01'\nmax_walltime = '00:00:05'", "pbs.max_walltime: 00:00:05 cannot work"),
        ("scheduler = 'slurm'\n[slurm]\ntime_min = '00:00:01'\ntime_max = '00:00:05'", "slurm.time_max: 00:00:05 cannot work"),
        ("[pbs]\npoll_s = 1e9", "pbs.poll_s: must be between"),
        ("[similarity]\nfar = 1.5", "similarity.far: must be between 0 and 1"),
        ("[similarity]\nfar = -0.1", "similarity.far: must be zero or more"),
    ],
)
def test_mistakes_name_file_and_key(tmp_path, text, where):
    path = tmp_path / "site.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(str(path))
    assert where in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such config"):
        load_config(tmp_path / "absent.toml")


def test_every_bundled_name_that_help_promises_loads():
    """``--config perlmutter`` said "no such config file" although --help promises bundled names: the site configs
    are bundled with the package, and an unknown name lists them."""
    assert load_config("perlmutter").scheduler == "slurm"
    assert load_config("polaris").scheduler == "pbs"
    with pytest.raises(ConfigError, match=r"bundled: local, perlmutter, polaris"):
        load_config("frontier")


def test_site_examples_load():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "configs"
    perlmutter = load_config(root / "perlmutter.toml")
    assert perlmutter.scheduler == "slurm" and perlmutter.slurm.qos == "preempt" and perlmutter.slurm.max_nodes == 8
    assert (perlmutter.runtime.kind, perlmutter.runtime.ranks_per_node, perlmutter.runtime.gpus_per_node) == ("torch", 4, 4)
    assert (perlmutter.pilots.max_queued_pilots, perlmutter.pilots.max_submits_per_minute) == (5, 6)
    polaris = load_config(root / "polaris.toml")
    assert (polaris.pilots.max_queued_pilots, polaris.pilots.max_submits_per_minute) == (5, 6)
    assert (polaris.runtime.kind, polaris.runtime.ranks_per_node, polaris.runtime.gpus_per_node) == ("torch", 4, 4)
    local = load_config(root / "local.toml")
    assert local.local.workload == "script" and len(local.local.script) == 2


@pytest.mark.parametrize(
    "text, says",
    [
        # [scheduler] written the way [runtime] kind is: say how to write it
        ("[scheduler]\nkind = 'slurm'\npartition = 7",
         'scheduler: is a plain key, not a table: write scheduler = "slurm" at the top of the file, before any [table], '
         "and its options (partition) under [slurm]"),
        ("[scheduler]\nkind = 'pbs'", 'scheduler: is a plain key, not a table: write scheduler = "pbs" at the top of the file, before any [table]; its options go under [pbs]'),
        # a top-level key after a table header belongs to that table in TOML
        ("[runtime]\nkind = 'torch'\nscheduler = 'slurm'", "runtime.scheduler: scheduler is a top-level key: move scheduler = 'slurm' above [runtime]"),
        ("runtime = 'horovod'", 'runtime: must be a table ([runtime]), got \'horovod\': write [runtime] with kind = "horovod" under it'),
        ("[pilots]\ngrace = 30", "pilots.grace: unknown key; did you mean grace_s?"),
        ("[local]\nwalltime_s = 30", "local.walltime_s: unknown key; did you mean pilot_walltime_s?"),
        ("schedular = 'local'", "schedular: unknown key; did you mean scheduler?"),
    ],
)
def test_config_errors_say_how_to_write_the_key_meant(tmp_path, text, says):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: {says}" or str(err.value).startswith(f"{path}: {says}"), str(err.value)
    assert "is not one of" not in str(err.value)
