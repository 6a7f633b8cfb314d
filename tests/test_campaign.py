"""`pilotfill run`: campaigns as ordinary Parsl code, with elastic apps on the local cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pilotfill.journal import Journal
from pilotfill.reasons import StopCause

pytestmark = pytest.mark.local

ROOT = Path(__file__).resolve().parent.parent

FAST = """scheduler = "local"
[local]
nodes = 2
workload = "none"
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 3.0
grace_s = 3.0
[controller]
tick_s = 0.1
[runtime]
kind = "processes"
"""


def pilotfill_run(campaign: Path, *args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pilotfill", "run", str(campaign), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=campaign.parent)  # fmt: skip


@pytest.fixture
def fast_config(tmp_path) -> Path:
    path = tmp_path / "fast.toml"
    path.write_text(FAST)
    return path


def test_elastic_app_arguments_fail_at_decoration():
    import pilotfill

    with pytest.raises(ValueError, match="max_nodes must be an integer >= min_nodes"):
        pilotfill.elastic_app(min_nodes=4, max_nodes=2)
    with pytest.raises(ValueError, match="min_nodes must be an integer >= 1"):
        pilotfill.elastic_app(min_nodes=0)
    with pytest.raises(ValueError, match="curve must be"):
        pilotfill.elastic_app(max_nodes=2, curve={"nodes": [1, 2], "samples_per_s": [1, 2]})
    with pytest.raises(ValueError, match="total_samples must be a positive number"):
        pilotfill.elastic_app(total_samples=-5)
    with pytest.raises(ValueError, match="group must be a string"):
        pilotfill.elastic_app(group=3)


def test_elastic_app_group_reaches_the_job_spec():
    import inspect

    import pilotfill
    from pilotfill.executors.decorator import RESOURCE_KEY

    app = pilotfill.elastic_app(max_nodes=2, group="alice")(lambda x: x)
    assert inspect.signature(app.func).parameters[RESOURCE_KEY].default["group"] == "alice"


def test_elastic_app_model_name_reaches_the_job_spec_and_is_checked():
    """Calls that say the same model are valued, before they report, by what the others of that name measured."""
    import inspect

    import pilotfill
    from pilotfill.executors.decorator import RESOURCE_KEY
    from pilotfill.executors.elastic import SPEC_KEYS

    app = pilotfill.elastic_app(max_nodes=2, model_name="resnet50-bs64")(lambda x: x)
    spec = inspect.signature(app.func).parameters[RESOURCE_KEY].default
    assert spec["model_name"] == "resnet50-bs64" and "model_name" in SPEC_KEYS  # what the executor submits
    with pytest.raises(ValueError, match="model_name must be a non-empty string"):
        pilotfill.elastic_app(model_name="")


def test_remote_exception_reaches_the_future_with_its_traceback(tmp_path, fast_config):
    campaign = tmp_path / "raising.py"
    campaign.write_text(
        """
import traceback, json, os
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes=1)
def diverge(lr):
    def inner_step(x):
        raise FloatingPointError(f"loss is nan at lr={x}")
    return inner_step(lr)

@pilotfill.elastic_app(min_nodes=1, max_nodes=2)
def fine(x):
    return x * 2

bad, good = diverge(10.0), fine(21)
exc = bad.exception()
with open(os.environ["OUT"], "w") as f:
    json.dump({"type": type(exc).__name__, "text": "".join(traceback.format_exception(exc)), "good": good.result()}, f)
"""
    )
    out = tmp_path / "out.json"
    result = pilotfill_run(campaign, "--config", str(fast_config), env={"OUT": str(out)})
    assert result.returncode == 1, result.stderr[-3000:]
    assert "failed" in result.stderr and "diverge" in result.stderr
    seen = json.loads(out.read_text())
    assert seen["type"] == "FloatingPointError"
    assert "loss is nan at lr=10.0" in seen["text"]
    assert "inner_step" in seen["text"]  # the remote frames are kept
    assert seen["good"] == 42
    run_dir = next((tmp_path / "runs").glob("2*"))
    state = Journal(run_dir, readonly=True)
    failed = [j for j in state.jobs() if j.status == "failed"]
    assert len(failed) == 1 and "FloatingPointError" in failed[0].error
    state.close()


def test_mixed_elastic_and_ordinary_apps_respect_dependencies(tmp_path, fast_config):
    campaign = tmp_path / "mixed.py"
    campaign.write_text(
        """
import os, time
from parsl import python_app
import pilotfill

def mark(what):
    with open(os.environ["MARKS"], "a") as f:
        f.write(f"{what} {time.time()}\\n")

@pilotfill.elastic_app(min_nodes=1, max_nodes=2)
def pretrain(seed):
    import os, time
    time.sleep(1.0)
    with open(os.environ["MARKS"], "a") as f:
        f.write(f"pretrain {time.time()}\\n")
    return seed + 1

@python_app(executors=["local"])
def pick(*scores):
    mark("pick")
    return max(scores)

@python_app
def plain(x):
    return x + 1000  # no executors named: Parsl may route it anywhere, it must still run

@pilotfill.elastic_app(min_nodes=1, max_nodes=2)
def finetune(best):
    import os, time
    with open(os.environ["MARKS"], "a") as f:
        f.write(f"finetune {time.time()}\\n")
    return best * 10

result = finetune(pick(pretrain(1), pretrain(2))).result()
assert result == 30, result
assert plain(1).result() == 1001
"""
    )
    marks = tmp_path / "marks"
    result = pilotfill_run(campaign, "--config", str(fast_config), env={"MARKS": str(marks)})
    assert result.returncode == 0, result.stderr[-3000:]
    events = [line.split() for line in marks.read_text().splitlines()]
    order = [name for name, _ in sorted(events, key=lambda e: float(e[1]))]
    assert order[:2] == ["pretrain", "pretrain"] and order[2:] == ["pick", "finetune"]


def test_rerun_after_kill_skips_finished_trainings(tmp_path, fast_config):
    campaign = tmp_path / "resume.py"
    campaign.write_text(
        """
import os
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes=1)
def train(i):
    import os, time
    time.sleep(1.0 if i < 2 else float(os.environ.get("SLOW_S", "1")))
    with open(os.environ["MARKS"], "a") as f:
        f.write(f"{i}\\n")
    return i * 10

print([f.result() for f in [train(i) for i in range(3)]])
"""
    )
    marks = tmp_path / "marks"
    env = {**os.environ, "MARKS": str(marks), "SLOW_S": "600"}
    first = subprocess.Popen([sys.executable, "-m", "pilotfill", "run", str(campaign), "--config", str(fast_config)],
                             env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline and not (marks.exists() and sorted(marks.read_text().split()) == ["0", "1"]):
        time.sleep(0.2)
    assert sorted(marks.read_text().split()) == ["0", "1"]
    time.sleep(1.0)  # Parsl checkpoints at task exit
    first.send_signal(signal.SIGKILL)
    first.wait()
    run1 = next((tmp_path / "runs").glob("2*"))
    # The controller and its ranks die with the campaign process.
    for _ in range(100):
        left = _processes_of(run1)
        if not left:
            break
        time.sleep(0.1)
    assert not _processes_of(run1)

    result = pilotfill_run(campaign, "--config", str(fast_config), env={"MARKS": str(marks), "SLOW_S": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[0, 10, 20]" in result.stdout
    assert sorted(marks.read_text().split()) == ["0", "1", "2"]  # 0 and 1 were not trained again
    run2 = max((tmp_path / "runs").glob("2*"))
    state = Journal(run2, readonly=True)
    assert [j.status for j in state.jobs()] == ["finished"]  # only the unfinished one was submitted
    state.close()


def _processes_of(run_dir: Path) -> list[int]:
    from pilotfill import procs

    return procs.with_environment(PILOTFILL_RUN_DIR=str(run_dir))


def test_nas_campaign_end_to_end(tmp_path, horovod):
    """The README's main job: at least 8 trials, best accuracy >= 0.9 on digits, nodes really moved."""
    results = tmp_path / "board.json"
    run_dir = tmp_path / "nas-run"
    result = pilotfill_run(ROOT / "workflows" / "nas_campaign.py", "--run-dir", str(run_dir), env={"NAS_RESULTS": str(results)}, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    board = json.loads(results.read_text())
    assert len(board) >= 8
    assert board[0]["val_accuracy"] >= 0.9
    assert "rank  depth" in result.stdout
    state = Journal(run_dir, readonly=True)
    jobs = state.jobs()
    events = state.events()
    counters = state.counters()
    state.close()
    assert sum(j.status == "finished" for j in jobs) >= 8
    # Nodes really moved: a running job was resized in place, or a job the main workload stopped resumed from what it
    # had committed on the nodes that came back. Which a run shows depends on how the trials' progress lines up with
    # the main workload's schedule (on a busy machine training is slower; one such run resumed two jobs on two nodes
    # each and resized none): both are elastic training. Resizes of running ranks have tests of their own
    # (test_runtimes.py, test_slurm.py).
    rescales = [e for e in events if e["kind"] == "job.resized" and e["data"]["before"] > 0 and e["data"]["after"] > 0]
    resumed = [e for e in events if e["kind"] == "job.started" and e["data"].get("progress", 0) > 0]
    assert rescales or resumed, "no training job was resized or resumed from its progress"
    assert not _processes_of(run_dir)
    # What the site saw: no more pilots than the main workload gave nodes back, plus the first fill of the 4 nodes.
    began, ended = events[0]["time"], events[-1]["time"]
    returned = _main_workload_returns(ended - began)
    submitted = sum(e["kind"] == "pilot.submitted" for e in events)
    assert submitted == counters["pilots_submitted"]
    assert submitted <= returned + 4, f"{submitted} pilots for {returned} returned nodes"
    # A job stops only when it lost its nodes, failed, or the allocation gained by stopping it; the events say which.
    for e in events:
        if e["kind"] == "job.stopped":
            cause = e["data"]["cause"]
            assert cause == StopCause.ALLOCATION and "objective" in e["data"] or lost_nodes(cause), e


def lost_nodes(cause: str) -> bool:
    """Whether a stop's cause is nodes its job lost (leaving, gone or lost), also while its ranks were forming."""
    forming = StopCause.WHILE_FORMING.say("")
    why = StopCause.of(cause.removesuffix(forming) if cause.endswith(forming) else cause)
    return why in (StopCause.NODES_LEAVING, StopCause.NODES_GONE, StopCause.NODES_LOST)

def _main_workload_returns(seconds: float) -> int:
    """Times the embedded default's main workload gave a node back within ``seconds`` of its start."""
    from pilotfill.config import load_config
    from pilotfill.schedulers.local import summit_schedule

    local = load_config().local
    changes, period = summit_schedule([f"{local.node_prefix}{i}" for i in range(local.nodes)], local.trace_seconds_per_second)
    returns = 0
    for loop in range(int(seconds // period) + 1):
        returns += sum(1 for c in changes if c.state == "idle" and 0 < c.at + loop * period <= seconds)
    return returns


def test_job_names_say_which_call_they_are():
    from pilotfill.executors.elastic import call_name

    assert call_name("train", (2, 96, "relu"), {"epochs": 5, "parsl_resource_specification": {}}) == "train(2, 96, 'relu', epochs=5)"
    assert len(call_name("train", (list(range(100)),), {})) == 48


README_PATTERN = """
import json, os
import pilotfill
from parsl import python_app

SAMPLES = 32                      # a module-level constant the app uses

def scaled(x):                    # a module-level helper the app calls
    return x * 10

@pilotfill.elastic_app(min_nodes=1, max_nodes=2)
def train(x):
    for _ in range(3):
        pilotfill.report(samples=SAMPLES)   # the module-level import, inside the rank
    return scaled(x)

@python_app(executors=["local"])
def leaderboard(*results):
    return sorted(results, reverse=True)

print(leaderboard(*[train(x) for x in (1, 2)]).result())
"""


@pytest.mark.parametrize("kind", ["processes", "torch"])
def test_an_elastic_app_uses_the_campaigns_imports_helpers_and_constants(tmp_path, kind, request):
    if kind == "torch":
        request.getfixturevalue("torch_runtime")
    config = tmp_path / "c.toml"
    config.write_text(FAST.replace('kind = "processes"', f'kind = "{kind}"'))
    campaign = tmp_path / "readme.py"
    campaign.write_text(README_PATTERN)
    result = pilotfill_run(campaign, "--config", str(config))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[20, 10]" in result.stdout
    run_dir = next((tmp_path / "runs").glob("2*"))
    state = Journal(run_dir, readonly=True)
    try:
        assert [j.progress % 96 == 0 and j.progress > 0 for j in state.jobs()] == [True, True]  # SAMPLES × 3 from every rank
    finally:
        state.close()


def test_what_cannot_be_shipped_is_named_when_the_app_is_called(tmp_path, fast_config):
    campaign = tmp_path / "unshippable.py"
    campaign.write_text(
        """
import threading
import pilotfill

LOCK = threading.Lock()

@pilotfill.elastic_app(min_nodes=1, max_nodes=1)
def train():
    with LOCK:
        return 1

print(train().exception())
"""
    )
    result = pilotfill_run(campaign, "--config", str(fast_config))
    assert "train(): cannot be sent to the nodes: it uses the global 'LOCK' (lock), which cannot be pickled" in result.stdout, result.stdout + result.stderr


def test_the_readme_example_runs_as_printed(tmp_path, request):
    """Users copy the README: its campaign, saved to a file, runs with `pilotfill run` on the embedded default."""
    request.getfixturevalue("torch_runtime")
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## A campaign", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    campaign = tmp_path / "campaign.py"
    campaign.write_text(code)
    result = pilotfill_run(campaign, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    board = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(board) == 4 and board == sorted(board, reverse=True) and board[0] > 0.8
    # What it took home is what dedicated nodes would have trained, whatever the local cluster's churn did: each call
    # run alone on one rank (reduction order moves no accuracy here by even one of 1,797 samples; in place joins once
    # moved one by 0.074).
    alone = sorted(_alone_on_one_rank(code, tmp_path), reverse=True)
    assert board == pytest.approx(alone, abs=1.5e-3), f"under churn {board}, on one rank {alone}"


ALONE = """
import os, sys, json
import pilotfill
import torch.distributed as dist

def as_plain_function(**declared):  # the app's own function, its global batch declared as the decorator does
    os.environ["PILOTFILL_GLOBAL_BATCH"] = str(declared["global_batch"])
    return lambda f: f

pilotfill.elastic_app = as_plain_function
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
exec(compile(open(sys.argv[2]).read().split("@python_app")[0], "campaign", "exec"))
out = []
for width in (32, 96):
    for lr in (0.1, 0.5):
        out.append(train(width, lr))
        dist.destroy_process_group()
print(json.dumps(out))
"""


def _alone_on_one_rank(code: str, tmp_path: Path) -> list[float]:
    """The README's calls, each trained on one rank outside pilotfill (a world of one)."""
    import socket

    assert "for w in (32, 96) for lr in (0.1, 0.5)" in code, "the README's sweep changed: change ALONE with it"
    (tmp_path / "alone.py").write_text(ALONE)
    (tmp_path / "readme_campaign.py").write_text(code)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = subprocess.run([sys.executable, str(tmp_path / "alone.py"), str(port), str(tmp_path / "readme_campaign.py")], capture_output=True,
                         text=True, timeout=600, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_each_shipped_campaign_says_which_runtime_each_app_uses():
    """Issue "What users bring": both shipped campaigns and the README say which runtime each app uses — an app that
    names one is run under it; one that names none says it runs on the config's."""
    import ast

    readme = (ROOT / "README.md").read_text()
    for path in sorted((ROOT / "workflows").glob("*_campaign.py")):
        tree = ast.parse(path.read_text())
        doc = ast.get_docstring(tree) or ""
        said = doc[doc.index("Runtime:") :] if "Runtime:" in doc else ""
        assert said, f"{path.name}: its docstring has no 'Runtime:' paragraph"
        apps = [(node.name, {k.arg: ast.literal_eval(k.value) for k in dec.keywords})
                for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                for dec in node.decorator_list if isinstance(dec, ast.Call) and getattr(dec.func, "attr", getattr(dec.func, "id", "")) == "elastic_app"]  # fmt: skip
        assert apps, f"{path.name}: no elastic_app"
        for name, kw in apps:
            assert f"``{name}``" in said, f"{path.name}: the Runtime paragraph does not name {name}"
            runtime = kw.get("runtime")
            assert (f'runtime="{runtime}"' in said) if runtime else ("config" in said), f"{path.name}: {name}'s runtime ({runtime}) is not what it says"
            assert f"`workflows/{path.name}`" in readme or f"`{path.name}`" in readme, f"README does not mention {path.name}"
        in_readme = readme[readme.index(path.name):][:600]
        assert "runtime" in in_readme, f"README: no word on the runtime of {path.name}"


# ---------------------------------------------------------------- issue 54, items 1 and 2: nothing answered silently from the past


def test_an_uncached_app_runs_every_call_one_after_the_other_and_at_once(tmp_path, fast_config):
    campaign = tmp_path / "sample.py"
    campaign.write_text(
        """
import json
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes=1, cache=False)
def sample(x):
    import os, random
    return [os.getpid(), random.random()]

first = sample(1).result()
second = sample(1).result()
together = [sample(1), sample(1)]
print(json.dumps([first, second] + [f.result() for f in together]))
"""
    )
    result = pilotfill_run(campaign, "--config", str(fast_config))
    assert result.returncode == 0, result.stderr[-3000:]
    draws = json.loads(result.stdout.strip().splitlines()[-1])
    assert len({tuple(d) for d in draws}) == 4, draws  # four bodies ran: four processes, four draws
    again = pilotfill_run(campaign, "--config", str(fast_config))  # and a re-run runs them all again
    assert again.returncode == 0, again.stderr[-3000:]
    redrawn = json.loads(again.stdout.strip().splitlines()[-1])
    assert not {tuple(d) for d in redrawn} & {tuple(d) for d in draws}


def test_a_cached_call_made_twice_at_once_is_one_training_and_said(tmp_path, fast_config):
    campaign = tmp_path / "twice.py"
    campaign.write_text(
        """
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes=1)
def sample(x):
    import os, time
    time.sleep(3)
    return os.getpid()

a, b = sample(1), sample(1)
print(a.result() == b.result())
"""
    )
    result = pilotfill_run(campaign, "--config", str(fast_config))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "True"
    said = " ".join(result.stderr.split())
    assert "sample(1) was called again while it trains: one training answers both calls" in said, said


def test_an_edited_app_runs_anew_and_the_summary_says_why(tmp_path, fast_config):
    campaign = tmp_path / "edited.py"
    source = """
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes=1)
def train(x):
    return "v1"

print("result", train(7).result())
"""
    campaign.write_text(source)
    first = pilotfill_run(campaign, "--config", str(fast_config))
    assert first.returncode == 0 and "result v1" in first.stdout, first.stderr[-3000:]
    campaign.write_text(source.replace('"v1"', '"v2"'))
    edited = pilotfill_run(campaign, "--config", str(fast_config))
    assert edited.returncode == 0, edited.stderr[-3000:]
    assert "result v2" in edited.stdout
    said = " ".join(edited.stderr.split())
    assert "train: its code changed since an earlier run: 1 call ran anew" in said, said
    same = pilotfill_run(campaign, "--config", str(fast_config))
    assert "result v2" in same.stdout
    said = " ".join(same.stderr.split())
    assert "train(7): its result was taken from an earlier call with the same code and arguments" in said, said
    # Another campaign beside it with an app of the same name and arguments but other code gets its own result.
    other = tmp_path / "other.py"
    other.write_text(source.replace('"v1"', '"other"'))
    beside = pilotfill_run(other, "--config", str(fast_config))
    assert beside.returncode == 0 and "result other" in beside.stdout, beside.stderr[-3000:]


# ---------------------------------------------------------------- issue 54, items 8 and 10: the commands say what is wrong in one line


def test_the_readmes_status_command_shows_a_run_directory_once(tmp_path, fast_config):
    campaign = tmp_path / "done.py"
    campaign.write_text("import pilotfill\n\n@pilotfill.elastic_app(min_nodes=1, max_nodes=1)\ndef work(x):\n    return x * 2\n\nprint(work(21).result())\n")
    result = pilotfill_run(campaign, "--config", str(fast_config), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-3000:]
    shown = subprocess.run([sys.executable, "-m", "pilotfill", "status", "--json", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    info = json.loads(shown.stdout)
    assert info["phase"] == "stopped" and [(j["name"], j["status"], j["result"]) for j in info["jobs"]] == [("work(21)", "finished", 42)]
    table = subprocess.run([sys.executable, "-m", "pilotfill", "status", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert table.returncode == 0 and "work(21)" in table.stdout and "finished" in table.stdout, table.stderr


@pytest.mark.parametrize(
    "args, said",
    [
        (["top", "{campaign}"], "is a file, not a run directory"),
        (["status", "{campaign}"], "is a file, not a run directory"),
        (["status", "{tmp}/nothing"], "no such run directory"),
        (["run", "{tmp}"], "is a directory: give the campaign's file"),
    ],
)
def test_a_command_given_the_wrong_kind_of_path_says_so_in_one_line(tmp_path, args, said):
    campaign = tmp_path / "c.py"
    campaign.write_text("print(1)\n")
    argv = [a.format(campaign=campaign, tmp=tmp_path) for a in args]
    result = subprocess.run([sys.executable, "-m", "pilotfill", *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and said in " ".join(result.stderr.split()), result.stderr


def test_a_campaigns_own_parsl_load_is_taken_for_its_retries(tmp_path, fast_config):
    campaign = tmp_path / "loads.py"
    campaign.write_text(
        """
import os
import parsl
from parsl.config import Config
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes=1, cache=False)
def flaky(marks):
    import os
    with open(marks, "a") as f:
        f.write("try\\n")
    if open(marks).read().count("try") < 2:
        raise RuntimeError("the first try fails")
    return "second try"

with parsl.load(Config(retries=2)):
    print("result", flaky(os.environ["MARKS"]).result())
"""
    )
    result = pilotfill_run(campaign, "--config", str(fast_config), env={"MARKS": str(tmp_path / "marks")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "result second try" in result.stdout
    said = " ".join(result.stderr.split())
    assert "parsl.load(): pilotfill run has loaded Parsl with its own executors" in said and "took retries=2" in said, said
