"""Configs: the embedded default loads from anywhere; every mistake names the file and the key."""

from __future__ import annotations

import pytest

from pilotfill.config import ConfigError, load_config


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
