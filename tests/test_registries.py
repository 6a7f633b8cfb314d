"""The name -> class tables of batch systems and runtimes, and what the rest of pilotfill derives from them.

A batch system or runtime is added in one place (pilotfill/schedulers/registry.py, pilotfill/elastic/registry.py):
the config's accepted names, the agent's ``--scheduler`` choices, the job spec's ``runtime`` check, the controller's
choice of adapter and runtime and the routing of a runtime's own messages all follow the tables.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from pilotfill import config as config_module
from pilotfill.config import Config, ConfigError, parse_config
from pilotfill.controller import Controller
from pilotfill.elastic import registry as runtimes
from pilotfill.elastic.base import Runtime
from pilotfill.elastic.simulated import SimulatedRuntime
from pilotfill.protocol import BY_TYPE, ProtocolError, check_spec
from pilotfill.schedulers import registry as batch_systems
from pilotfill.schedulers.base import BatchScheduler, NodeAccess, RemoteNodes, host_of
from pilotfill.schedulers.replay import ReplayScheduler
from pilotfill.traces import read_trace

pytestmark = pytest.mark.unit


def test_every_batch_system_in_the_table_is_an_adapter_that_says_what_it_needs():
    assert batch_systems.NAMES == tuple(batch_systems.BATCH_SYSTEMS) == config_module.SCHEDULERS
    for name in batch_systems.NAMES:
        cls = batch_systems.adapter_class(name)
        assert issubclass(cls, BatchScheduler) and not inspect.isabstract(cls), name
        assert cls.from_config.__func__ is not BatchScheduler.from_config.__func__, f"{name}: made from a config"
        assert issubclass(cls.node_access, NodeAccess) and cls.selects and cls.title != BatchScheduler.title, name
    with pytest.raises(ValueError, match=r"unknown batch system 'lsf' \(known: local, slurm, pbs\)"):
        batch_systems.adapter_class("lsf")


def test_every_runtime_in_the_table_is_made_from_a_config_and_names_its_messages():
    assert runtimes.NAMES == tuple(runtimes.RUNTIMES) == config_module.RUNTIMES
    for name in runtimes.NAMES:
        cls = runtimes.runtime_class(name)
        assert issubclass(cls, Runtime) and not inspect.isabstract(cls), name
        assert cls.from_config.__func__ is not Runtime.from_config.__func__, name
        assert all(t in BY_TYPE for t in cls.handles), f"{name}: its messages are in the protocol"
    assert runtimes.runtime_class("torch").handles == ("rdzv.join", "rdzv.poll")
    with pytest.raises(ValueError, match="unknown runtime 'mpi'"):
        runtimes.runtime_class("mpi")


def test_the_config_takes_its_names_and_node_selectors_from_the_adapters():
    with pytest.raises(ConfigError, match=r"scheduler: 'lsf' is not one of local, slurm, pbs"):
        parse_config({"scheduler": "lsf"})
    with pytest.raises(ConfigError, match=r"node_types\.a100\.constraint: is how Slurm selects nodes, but scheduler = 'pbs': use select or queue"):
        parse_config({"scheduler": "pbs", "node_types": {"a100": {"constraint": "a100"}}})
    with pytest.raises(ConfigError, match=r"node_types\.a100\.select: is how PBS selects nodes, but scheduler = 'slurm'"):
        parse_config({"scheduler": "slurm", "node_types": {"a100": {"select": "ngpus=4"}}})
    with pytest.raises(ConfigError, match=r"node_types\.a100: says nothing that selects these nodes: set partition or constraint or gres"):
        parse_config({"scheduler": "slurm", "node_types": {"a100": {"ranks_per_node": 4}}})
    typed = parse_config({"scheduler": "pbs", "node_types": {"a100": {"select": "ngpus=4"}, "v100": {"queue": "v100q"}}})
    assert [t.name for t in typed.node_types] == ["a100", "v100"]


def test_a_job_spec_names_a_runtime_of_the_table():
    spec = {"name": "j", "entry": "m:f", "min_nodes": 1, "max_nodes": 2, "runtime": "mpi"}
    with pytest.raises(ProtocolError, match="runtime must be one of processes, horovod, torch, got 'mpi'"):
        check_spec(spec)


def test_each_batch_system_says_how_its_agent_reaches_another_node(tmp_path: Path):
    log = tmp_path / "j.log"
    env = {"A": "1"}
    local = batch_systems.adapter_class("local").node_access(python="py")
    assert local.is_here("n3", "anyhost") and local.run_on("n3", ["x"], env, log) == ["x"] and local.end_on("n3", ["end"]) is None

    slurm = batch_systems.adapter_class("slurm").node_access(python="py")
    assert isinstance(slurm, RemoteNodes) and slurm.is_here("nid1.cluster", "nid1") and not slurm.is_here("nid2", "nid1")
    assert slurm.run_on("nid2", ["x"], env, log) == ["srun", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=nid2", "--kill-on-bad-exit=1",
                                                      "env", "A=1", "PILOTFILL_HOST=nid2", "x"]  # fmt: skip
    assert slurm.end_on("nid2", ["end"]) is None, "ending the srun ends its step: nothing more to run there"

    pbs = batch_systems.adapter_class("pbs").node_access(python="py")
    assert pbs.is_here("vm[1]", "vm") and not pbs.is_here("vn[0]", "vm") and host_of("vn[0]") == "vn"
    assert pbs.run_on("vn[0]", ["x"], env, log) == ["pbs_tmrsh", "vn", "py", "-m", "pilotfill.pilots.keeper", "--log", str(log), "--",
                                                    "env", "A=1", "PILOTFILL_HOST=vn[0]", "x"]  # fmt: skip
    assert pbs.end_on("vn[0]", ["end"]) == ["pbs_tmrsh", "vn", "end"], "pbs_tmrsh forwards no signal: the agent ends them there"
    with pytest.raises(NotImplementedError, match="pass --nodes"):
        local.nodes_of_this_job()


def test_the_agent_offers_the_batch_systems_of_the_table(capsys):
    from pilotfill.pilots import agent

    with pytest.raises(SystemExit):
        agent.main(["--run-dir", "x", "--pilot", "p", "--scheduler", "lsf"])
    assert "invalid choice: 'lsf' (choose from 'local', 'slurm', 'pbs')" in capsys.readouterr().err


class _RendezvousRuntime(SimulatedRuntime):
    """The replay's runtime answering the torch agents' rendezvous, to see the controller route it there."""

    handles = ("rdzv.join", "rdzv.poll")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked: list[str] = []

    def handle(self, message, now: float):
        self.asked.append(message.TYPE)
        return message.REPLY(state="wait", round=0)  # its type's reply class, as a runtime answers


@pytest.mark.parametrize("runtime", [SimulatedRuntime, _RendezvousRuntime])
def test_the_controller_routes_a_runtimes_own_messages_to_it(tmp_path, runtime):
    trace = read_trace_text(tmp_path)
    ctl = Controller(tmp_path / "run", Config(scheduler="replay"), scheduler=ReplayScheduler(trace, queue_delay_s=0.0, grace_s=5.0),
                     runtime=runtime({}, now=trace.start), clock=lambda: trace.start)  # fmt: skip
    reply = ctl.handle({"type": "rdzv.join", "job_id": "j", "host": "n0", "last_round": -1})
    if runtime is SimulatedRuntime:
        assert not reply["ok"] and "rdzv.join: no torch job runs in this campaign" in reply["error"], reply
    else:
        assert reply == {"ok": True, "state": "wait", "round": 0} and ctl.runtime.asked == ["rdzv.join"]
    ctl.shutdown()


def read_trace_text(tmp_path: Path):
    path = tmp_path / "trace.csv"
    path.write_text("time,node,state\n2021-02-10T00:00:00Z,n0,idle\n2021-02-10T01:00:00Z,,end\n")
    return read_trace(path)


def test_one_runtime_per_job_answers_a_message_only_once_a_job_of_that_kind_made_it():
    from pilotfill.elastic.runtimes import JobRuntimes

    made = {"processes": SimulatedRuntime({}, now=0.0), "torch": _RendezvousRuntime({}, now=0.0)}
    runtimes_ = JobRuntimes("processes", made.__getitem__)
    assert runtimes_.answering("rdzv.join") is None, "no torch job yet: nothing answers the torch agents"
    runtimes_.of_kind("torch")
    assert runtimes_.answering("rdzv.poll") is made["torch"] and runtimes_.answering("job.report") is None
