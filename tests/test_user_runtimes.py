"""The runtime follows the code (issue "What users bring": code for another runtime).

An app names the runtime its code is written for (``@elastic_app(runtime="horovod")``)
and runs under it whatever the site config's ``[runtime] kind``; code that calls
Horovod under a runtime that did not launch it with horovodrun fails at once,
saying how to run it, instead of running as N worlds of one. Every combination
of app runtime and configured runtime, through the real controller, pilot
agents and ranks on the local cluster; then a held-out-style Horovod campaign
under the embedded default config, as a new user runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import IN_CI
from localrun import LocalRun

from pilotfill.elastic.guard import horovod_message, torch_message

pytestmark = pytest.mark.local

HERE = Path(__file__).resolve().parent

CONFIG = """scheduler = "local"
[local]
nodes = 4
workload = "none"
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 5.0
grace_s = 3.0
[controller]
tick_s = 0.1
[runtime]
kind = "{kind}"
"""

APPS = {
    # app: (the API its code uses, the runtime it names)
    "horovod": ("horovod", "horovod"),
    "torch": ("torch", "torch"),
    "horovod-code-naming-none": ("horovod", None),
    "horovod-code-naming-torch": ("horovod", "torch"),  # the app names the wrong runtime: refused the same way
    "plain-naming-processes": ("processes", "processes"),  # one process per rank, no collective library
    "torch-code-naming-none": ("torch", None),
    "torch-code-naming-processes": ("torch", "processes"),
    "torch-code-naming-horovod": ("torch", "horovod"),
}


def _needs_torch_and_horovod() -> None:
    try:
        import horovod.torch  # noqa: F401
        import torch.distributed

        if not torch.distributed.is_gloo_available():
            raise ImportError("this torch has no gloo")
    except ImportError as exc:
        if IN_CI:
            pytest.fail(f"CI needs torch (gloo) and Horovod (make install): {exc}")
        pytest.skip(f"needs torch with gloo and Horovod ({exc}); `make install` builds them")


@pytest.fixture(scope="module", params=["torch", "horovod", "processes"])
def configured(request, tmp_path_factory):
    """A controller on the local cluster with ``[runtime] kind`` = the param, its ranks able to import rank_probe."""
    _needs_torch_and_horovod()
    kind = request.param
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), old or ""])
    run = LocalRun(tmp_path_factory.mktemp(f"configured-{kind}"), config=CONFIG.format(kind=kind))
    try:
        run.start(timeout_s=120)
        yield kind, run
    finally:
        run.stop()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
        run.wait_for(lambda: not run.leftover_processes(), 30, "no leftover processes")
        assert run.leftover_processes() == []


@pytest.mark.parametrize("app", list(APPS))
def test_an_app_runs_under_the_runtime_its_code_needs_or_says_how(configured, app, tmp_path):
    kind, run = configured
    api, named = APPS[app]
    out = tmp_path / "ranks.jsonl"
    spec = {"name": app, "entry": "rank_probe:probe", "kwargs": {"out": str(out), "runtime": api, "hold_s": 1.0}, "min_nodes": 2, "max_nodes": 2}
    if named:
        spec["runtime"] = named
    job = run.client.submit(spec)
    done = run.client.wait([job], timeout_s=300)[job]
    runs_under = named or kind
    if api == "horovod" and runs_under != "horovod":
        # Horovod code where horovodrun did not launch it: one clear failure, no rank trained as a world of its own.
        assert done["status"] == "failed", done
        last = done["error"].strip().splitlines()[-1]
        assert last == f"pilotfill.elastic.guard.RuntimeMismatch: {horovod_message(runs_under)}", last
        assert 'runtime="horovod"' in last
        assert not out.exists() or not out.read_text().strip(), "a rank ran as a Horovod world of one"
        return
    if api == "torch" and runs_under != "torch":
        # torch.distributed's env:// rendezvous where torch's agent did not set it up: pilotfill's line, not torch's.
        assert done["status"] == "failed", done
        last = done["error"].strip().splitlines()[-1]
        assert last == f"pilotfill.elastic.guard.RuntimeMismatch: {torch_message(runs_under)}", last
        assert not out.exists() or not out.read_text().strip()
        return
    assert done["status"] == "finished", done.get("error")
    seen = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["rank"] for r in seen) == [0, 1], seen
    assert {r["size"] for r in seen} == {2}, f"world size is not nodes x ranks: {seen}"  # one job, not two worlds of one
    assert len({r["host"] for r in seen}) == 2


def test_elastic_app_checks_the_runtime_it_names():
    import pilotfill

    with pytest.raises(ValueError, match="runtime must be one of processes, horovod, torch"):
        pilotfill.elastic_app(runtime="mpi")


def test_a_spec_naming_an_unknown_runtime_is_refused():
    from pilotfill.protocol import ProtocolError, check_spec

    with pytest.raises(ProtocolError, match="runtime must be one of processes, horovod, torch"):
        check_spec({"name": "x", "entry": "m:f", "min_nodes": 1, "max_nodes": 1, "runtime": "mpi"})


# ------------------------------------------------------------------ a held-out-style campaign, as a new user runs it

CAMPAIGN = '''
import json, os
import torch
import horovod.torch as hvd
import pilotfill


@pilotfill.elastic_app(min_nodes=2, max_nodes=2{runtime})
def train(lr):
    hvd.init()
    with open(os.environ["SIZES"], "a") as f:
        f.write(json.dumps({{"rank": hvd.rank(), "size": hvd.size()}}) + "\\n")
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr), named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, epoch=0)

    @hvd.elastic.run
    def loop(state):
        while state.epoch < 3:
            opt.zero_grad()
            model(torch.ones(8, 4)).sum().backward()
            opt.step()
            pilotfill.report(samples=8)
            state.epoch += 1
            state.commit()
        return hvd.size()

    return loop(state)


print("world", train(0.1).result())
'''


def _campaign(tmp_path: Path, runtime: str) -> tuple[subprocess.CompletedProcess, Path]:
    campaign, sizes = tmp_path / "campaign.py", tmp_path / "sizes.jsonl"
    campaign.write_text(CAMPAIGN.format(runtime=f", runtime={runtime!r}" if runtime else ""))
    out = subprocess.run([sys.executable, "-m", "pilotfill", "run", str(campaign)], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path, env={**os.environ, "SIZES": str(sizes)})  # fmt: skip
    return out, sizes


def test_a_horovod_campaign_under_the_default_config_runs_under_horovod_saying_so_once(tmp_path, horovod):
    """BFTrainer's users write Elastic Horovod and name no runtime: the app's code says Horovod (it imports
    horovod.torch), so it runs under the Horovod runtime on the default config (torch), said once on the progress
    line — no longer a RuntimeMismatch to fix by hand."""
    out, sizes = _campaign(tmp_path, "")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "world 2" in out.stdout
    said = [line for line in out.stderr.splitlines() if "runs under the horovod runtime" in line]
    assert len(said) == 1 and "train()" in said[0] and "(the config's is torch)" in said[0], out.stderr[-3000:]
    seen = [json.loads(line) for line in sizes.read_text().splitlines()]
    assert seen and {r["size"] for r in seen} == {2} and {r["rank"] for r in seen} == {0, 1}, seen  # one world of two


TORCH_CAMPAIGN = """
import json, os
import pilotfill
import torch.distributed as dist


@pilotfill.elastic_app(min_nodes=2, max_nodes=2)
def train():
    dist.init_process_group("gloo")
    return dist.get_world_size()


print("world", train().result())
"""


def test_a_torch_campaign_under_a_horovod_config_runs_under_torch_saying_so_once(tmp_path, horovod):
    config = tmp_path / "hvd.toml"
    config.write_text(CONFIG.format(kind="horovod"))
    campaign = tmp_path / "campaign.py"
    campaign.write_text(TORCH_CAMPAIGN)
    out = subprocess.run([sys.executable, "-m", "pilotfill", "run", str(campaign), "--config", str(config)], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "world 2" in out.stdout
    said = [line for line in out.stderr.splitlines() if "runs under the torch runtime" in line]
    assert len(said) == 1 and "(the config's is horovod)" in said[0], out.stderr[-3000:]


def test_the_runtime_an_apps_code_is_written_for_is_read_from_its_code():
    """What decides (pilotfill/executors/detect.py): imports and references of the function, its nested functions,
    and the campaign's own helpers it calls; Horovod wins over torch; plain code says nothing."""
    import horovod.torch as hvd
    import torch
    import torch.distributed as dist

    from pilotfill.executors.detect import detect_runtime

    def plain(x):
        return x + 1

    def imports_inside():
        import horovod.torch as h  # noqa: F401

    def module_global():
        hvd.init()

    def helper():
        dist.init_process_group("gloo")

    def calls_helper():
        return helper()

    def attribute_chain():
        torch.distributed.init_process_group("gloo")

    def both():
        hvd.init()
        dist.barrier()

    def elastic_loop():
        @hvd.elastic.run
        def loop(state):
            return state
        return loop

    assert detect_runtime(plain) is None
    assert detect_runtime(imports_inside) == ("horovod", "imports horovod.torch")
    assert detect_runtime(module_global)[0] == "horovod"
    assert detect_runtime(calls_helper)[0] == "torch"
    assert detect_runtime(attribute_chain) == ("torch", "calls init_process_group()")
    assert detect_runtime(both)[0] == "horovod"
    assert detect_runtime(elastic_loop)[0] == "horovod"


def test_a_horovod_campaign_naming_its_runtime_runs_under_horovod_with_the_default_config(tmp_path, horovod):
    out, sizes = _campaign(tmp_path, "horovod")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "world 2" in out.stdout
    seen = [json.loads(line) for line in sizes.read_text().splitlines()]
    assert seen and {r["size"] for r in seen} == {2} and {r["rank"] for r in seen} == {0, 1}, seen  # nodes x ranks
