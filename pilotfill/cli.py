"""The ``pilotfill`` command (typer + rich)."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from .allocator import Formulation, Objective
from .allocator.similarity import LibraryError
from .config import ControllerConfig, SimilarityConfig
from .library_file import read_library
from .lifecycle import LIVE_PILOT_STATES, JobStatus
from .traces import InputError, format_time, parse_time, read_jobs, read_models, read_trace, with_models

app = typer.Typer(
    help="Train neural networks on the nodes a supercomputer leaves idle.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
err = Console(stderr=True, soft_wrap=True)  # messages name files and lines: never break them

DATA = Path(__file__).parent / "data"
DEFAULT_TRACE = DATA / "summit-2021-02-10-week-64nodes.csv.gz"
DEFAULT_JOBS = DATA / "jobs-imagenet-1001.csv"


class Profiles(str, Enum):
    known = "known"
    learned = "learned"


class TypeMode(str, Enum):
    aware = "aware"
    blind = "blind"


class ShareBy(str, Enum):
    group = "group"
    model = "model"
    family = "family"


class Accounting(str, Enum):
    bftrainer = "bftrainer"
    realistic = "realistic"


class Admission(str, Enum):
    worth = "worth"
    arrival = "arrival"


def _time_option(value: Optional[str], name: str) -> Optional[float]:
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is not an ISO-8601 time (e.g. 2021-02-10T20:21:15Z)", param_hint=name
        ) from None


@app.callback()
def main() -> None:
    """pilotfill: pilot jobs that harvest idle nodes for elastic training."""


@app.command()
def run(
    script: Annotated[
        Path, typer.Argument(help="The campaign: ordinary Parsl code with @pilotfill.elastic_app training functions.")
    ],
    config: Annotated[
        Optional[str],
        typer.Option(
            "--config", "-c", help="Site config file, or a bundled name (default: the embedded local cluster)."
        ),
    ] = None,
    run_dir: Annotated[
        Optional[Path], typer.Option(help="Run directory (default: runs/<id>/ beside the campaign).")
    ] = None,
    tui: Annotated[
        bool,
        typer.Option("--tui", help="Show the live view while the campaign runs (its output goes to campaign.out)."),
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress line: only the campaign's output and the summary.")
    ] = False,
) -> None:
    """Run a campaign: start the controller, load Parsl with the elastic executor, run the script, wait, clean up.
    Ctrl-C stops it cleanly: trainings end, pilots are deleted, and a re-run resumes from the commits."""
    from .campaign import CampaignError, CampaignScriptError, Interrupt, default_run_dir, run_campaign
    from .config import ConfigError
    from .progress import AppCounts, print_failures, show

    apps = AppCounts()
    where: dict[str, Path] = {}
    interrupt = Interrupt(say=lambda text: err.print(Text(text), highlight=False))
    try:
        with interrupt.installed():
            if tui:
                from .tui import run_with_view

                run_dir = run_dir or default_run_dir(script.resolve())
                outcome = run_with_view(
                    lambda: run_campaign(script, config, run_dir, apps=apps, interrupt=interrupt), run_dir
                )
            else:
                def work():
                    return run_campaign(
                        script,
                        config,
                        run_dir,
                        apps=apps,
                        on_run_dir=lambda d: where.setdefault("run_dir", d),
                        interrupt=interrupt,
                    )

                outcome = show(work, apps, lambda: where.get("run_dir"), err, quiet=quiet)
    except (CampaignError, ConfigError) as exc:
        # the message is text, not markup: [slurm] stays
        err.print("[bold red]error:[/]", Text(str(exc)), highlight=False)
        raise typer.Exit(2) from None
    except CampaignScriptError as exc:
        err.print(Text(str(exc)), highlight=False)
        err.print(f"[bold red]error:[/] the campaign {script} raised (its traceback is above)", highlight=False)
        raise typer.Exit(1) from None
    print_failures(outcome.failed, err)
    table = Table(title=f"campaign {script.name}: run directory {outcome.run_dir}")
    table.add_column("apps finished", justify="right")
    table.add_column("reused results", justify="right")
    table.add_column("failed or not run", justify="right")
    table.add_row(str(outcome.done), str(outcome.cached), str(len(outcome.failed)))
    err.print(table)
    for note in outcome.notes:
        err.print("[yellow]note:[/]", Text(note), highlight=False)
    if outcome.stopped:
        err.print(Text(outcome.stopped), highlight=False)
    if outcome.fatal:
        err.print(f"[bold red]error:[/] the campaign could not go on: {outcome.fatal}", highlight=False)
    if outcome.interrupted:
        err.print(
            Text(
                f"pilotfill: {outcome.interrupted}: the controller stopped and deleted its pilots; "
                "run it again to resume from the commits"
            ),
            highlight=False,
        )
        raise typer.Exit(130)
    if not outcome.ok:
        raise typer.Exit(1)


@app.command()
def top(
    run_dir: Annotated[
        Optional[Path], typer.Argument(help="Run directory (default: the newest under ./runs).", readable=False)
    ] = None,
) -> None:
    """Watch a run live: pilots, node occupancy, jobs, events. Read-only; q or Ctrl-C leaves."""
    from .tui import top as show
    from .tui import unreadable

    if run_dir is not None:
        run_dir = _run_dir_or_exit(run_dir)
    if run_dir is None:
        candidates, closed = [], []
        for p in sorted(Path("runs").glob("*")) if not unreadable(Path("runs")) else []:
            why = unreadable(p) or unreadable(p / "state.sqlite")
            if why:
                closed.append(why)
            elif (p / "state.sqlite").exists():
                candidates.append(p)
        if not candidates:
            why = unreadable(Path("runs")) or (closed[-1] if closed else None)
            err.print(
                "[bold red]error:[/]", Text(why or "no run directory given and none under ./runs"), highlight=False
            )
            raise typer.Exit(2)
        run_dir = candidates[-1]
    from .tui import RunUnreadable, read_snapshot

    try:
        snap, source = read_snapshot(run_dir)  # one line now rather than a traceback inside the live view
    except RunUnreadable as exc:
        err.print("[bold red]error:[/]", Text(str(exc)), highlight=False)
        raise typer.Exit(2) from None
    if not sys.stdout.isatty():  # piped or redirected: one frame, as `top -b -n 1` does
        from .tui import render, view_from_snapshot

        view = view_from_snapshot(snap, title=f"pilotfill top {run_dir.name}")
        view.source = source
        Console(width=120).print(render(view, 120, 40))
        return
    show(run_dir)


@app.command()
def replay(
    trace: Annotated[
        Path, typer.Argument(help="Node-availability trace (time,node,state; .csv or .csv.gz).")
    ] = DEFAULT_TRACE,
    jobs: Annotated[
        Path, typer.Argument(help="Job file (name,model,submit_time,…,nodes,samples_per_s[,objective]).")
    ] = DEFAULT_JOBS,
    start: Annotated[Optional[str], typer.Option(help="Window start, ISO-8601 as in the trace.")] = None,
    end: Annotated[Optional[str], typer.Option(help="Window end, ISO-8601 as in the trace.")] = None,
    nodes: Annotated[
        Optional[int], typer.Option(help="Use the first N nodes of the trace (file order).", min=1)
    ] = None,
    max_jobs: Annotated[
        int,
        typer.Option(
            help="At most this many jobs run at once (BFTrainer's setup: 10); "
                 "0: no cap, as many as the machine can start.",
            min=0,
        ),
    ] = 0,
    tfwd: Annotated[
        float,
        typer.Option(
            help="A fixed look-ahead T_fwd for the allocator, seconds (BFTrainer's setup: 10); "
                 "0: the nodes' expected hold, learned from the trace as it goes.",
            min=0.0,
        ),
    ] = 0.0,
    formulation: Annotated[
        Formulation, typer.Option(help="aggregated: exact (DP where it applies, MILP otherwise).")
    ] = Formulation.AGGREGATED,
    profiles: Annotated[
        Profiles, typer.Option(help="known: the jobs' curves; learned: JPA learns each job from its own noisy reports.")
    ] = Profiles.known,
    noise: Annotated[
        float, typer.Option(help="Relative noise of reported throughput with --profiles learned.", min=0.0)
    ] = 0.03,
    seed: Annotated[int, typer.Option(help="Seed of the report noise.")] = 0,
    time_limit: Annotated[
        float, typer.Option(help="Solver time limit per event, seconds (then incumbent or greedy).", min=0.001)
    ] = 1.0,
    accounting: Annotated[
        Accounting,
        typer.Option(
            help="bftrainer: starts free, stops cost a shrink (BFTrainer's figures compare); "
                 "realistic: starts cost 30 s, stops lose work since the last commit."
        ),
    ] = Accounting.bftrainer,
    queue_delay: Annotated[
        float, typer.Option(help="Seconds a pilot waits in the batch queue before it starts.", min=0.0)
    ] = 0.0,
    grace: Annotated[
        float, typer.Option(help="Seconds between a pilot's SIGTERM (preemption, walltime) and its end.", min=0.0)
    ] = 5.0,
    pilot_walltime: Annotated[float, typer.Option(help="Pilot walltime, hours.", min=0.01)] = 6.0,
    nodes_per_pilot: Annotated[int, typer.Option(help="Nodes a pilot asks for at most.", min=1)] = 1,
    run_dir: Annotated[
        Optional[Path], typer.Option(help="Keep the controller's run directory (its journal: pilotfill top RUN_DIR).")
    ] = None,
    plot: Annotated[
        Optional[Path], typer.Option(help="Write a PNG of idle nodes and nodes used by training over time.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout instead of tables.")] = False,
    tui: Annotated[bool, typer.Option("--tui", help="Show the simulated machine live while it replays.")] = False,
    speed: Annotated[
        Optional[float],
        typer.Option(
            help="With --tui: trace seconds per second (e.g. 3600: an hour a second); default as fast as it goes.",
            min=0.001,
        ),
    ] = None,
    node_types: Annotated[
        Optional[Path],
        typer.Option(
            "--node-types", help="Node-type map (node,type or node,gpu_type): a machine with several kinds of node."
        ),
    ] = None,
    nodes_per_type: Annotated[
        Optional[int], typer.Option(help="Keep the first N nodes of each node type (instead of --nodes).", min=1)
    ] = None,
    types: Annotated[
        TypeMode,
        typer.Option(
            "--types",
            help="aware: the controller knows each node's type; "
                 "blind: it does not (jobs still run at their rate on the type they land on).",
        ),
    ] = TypeMode.aware,
    library: Annotated[
        Optional[Path],
        typer.Option(help="Similarity library (JSON) of measured models, with --profiles learned on a typed machine."),
    ] = None,
    models: Annotated[
        Optional[Path],
        typer.Option(help="Model descriptors (model,parameters,flops_per_sample,layers,…): "
                          "what each job's model is."),
    ] = None,
    hold_out: Annotated[
        Optional[str], typer.Option(help="Leave this family (a library entry's family) out of the library.")
    ] = None,
    objective: Annotated[
        Objective,
        typer.Option(
            help="samples: the most samples in all; "
                 "share: each group (--share-by) its share of the machine first, then the most samples."
        ),
    ] = Objective.SAMPLES,
    share_by: Annotated[
        ShareBy,
        typer.Option(
            help="With --objective share, a job's group: "
                 "the job file's group column, its model, or its model's family (the model less -bsN)."
        ),
    ] = ShareBy.group,
    share_cost: Annotated[
        float,
        typer.Option(
            help="With --objective share: the most of a decision's samples optimum the shares may cost "
                 "(1: whole shares, whatever they cost).",
            min=0.0,
            max=1.0,
        ),
    ] = ControllerConfig.share_cost,
    far: Annotated[
        float,
        typer.Option(
            help="With --library: a model whose nearest library model is less similar than this "
                 "is measured once on every type (0: trust any neighbour).",
            min=0.0,
            max=1.0,
        ),
    ] = SimilarityConfig.far,
    admission: Annotated[
        Admission,
        typer.Option(
            help="Which waiting jobs a decision weighs: "
                 "worth: by what starting each would add (a job waiting a day goes first); "
                 "arrival: first come, first served (BFTrainer's setup)."
        ),
    ] = Admission.worth,
) -> None:
    """Replay a scheduler's node-availability log and report what pilotfill would have trained.

    With no arguments it replays the bundled excerpt (the first 64 nodes of
    Summit, 10–17 Feb 2021) with the ImageNet jobs, every job admitted as the
    machine can start it and changes valued over the learned horizon;
    BFTrainer's published setup is --max-jobs 10 --tfwd 10 --admission arrival.
    """
    from .replay import Replay

    t0, t1 = _time_option(start, "--start"), _time_option(end, "--end")
    if trace == DEFAULT_TRACE and jobs == DEFAULT_JOBS and start is None and end is None:
        t0, t1 = parse_time("2021-02-10T20:21:15Z"), parse_time("2021-02-17T00:00:00Z")
    try:
        with err.status("reading the trace and the jobs", spinner="dots") if not as_json else nullcontext():
            tr = read_trace(trace, nodes=nodes, start=t0, end=t1, types=node_types, nodes_per_type=nodes_per_type)
            specs = read_jobs(jobs)
            if models is not None:
                specs = with_models(specs, read_models(models))
            lib = None
            if library is not None:
                if not library.is_file():
                    raise InputError(library, None, "no such library file")
                lib = read_library(library)
                if hold_out:
                    lib = lib.without(hold_out)
    except (InputError, LibraryError) as exc:
        err.print("[bold red]error:[/]", Text(str(exc)), highlight=False)
        raise typer.Exit(2) from None
    sim = Replay(
        tr,
        specs,
        max_jobs=max_jobs,
        t_fwd=tfwd,
        formulation=formulation.value,
        profiles=profiles.value,
        noise=noise,
        seed=seed,
        time_limit_s=time_limit,
        keep_timeline=plot is not None,
        accounting=accounting.value,
        queue_delay_s=queue_delay,
        grace_s=grace,
        pilot_walltime_s=pilot_walltime * 3600,
        nodes_per_pilot=nodes_per_pilot,
        run_dir=run_dir,
        node_types=types.value,
        library=lib,
        objective=objective.value,
        share_by=share_by.value,
        share_cost=share_cost,
        far=far,
        admission=admission.value,
    )

    if tui and not as_json:
        from .tui import replay_with_view

        result = replay_with_view(sim, speed=speed)
    elif as_json or not sys.stderr.isatty():
        result = sim.run()
    else:
        with Progress(
            TextColumn("[bold]replay[/]"),
            BarColumn(),
            TextColumn("{task.fields[when]}"),
            TextColumn("jobs done {task.fields[done]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
        ) as bar:
            task = bar.add_task("replay", total=tr.end - tr.start, when="", done=0)

            def tick(t: float, sim) -> None:
                bar.update(task, completed=t - tr.start, when=format_time(t), done=sim.jobs_done())

            result = sim.run(tick)

    summary = result.as_dict()
    if plot is not None:
        from .plots import plot_replay

        plot_replay(result, plot)
        summary["plot"] = str(plot)
    if as_json:
        typer.echo(json.dumps(summary))
        return
    Console().print(_summary_table(summary, result))


def _summary_table(s: dict, result) -> Table:
    from .progress import plural

    table = Table(
        title=f"replay of {Path(s['trace']).name}: {plural(s['nodes'], 'node')}, "
              f"{format_time(s['start'])} → {format_time(s['end'])}"
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [
        ("events (allocations)", f"{s['events']:,}"),
        ("trace transitions", f"{s['transitions']:,}"),
        ("idle node-hours", f"{s['idle_node_hours']:,.1f}"),
        ("node-hours used by training", f"{s['used_node_hours']:,.1f}"),
        ("samples processed", f"{s['samples']:.4g}"),
        ("lost to rescaling and preemption", f"{s['lost_samples']:.4g}"),
        ("efficiency (overhead only)", f"{100 * s['efficiency']:.2f}%"),
        ("jobs completed / started", f"{s['jobs_completed']} / {s['jobs_started']}"),
        (
            "jobs past their declared work / open at the end",
            f"{s['jobs_overran']} / {s['jobs_running_at_end']} running, {s['jobs_waiting_at_end']} waiting",
        ),
        ("samples redone after stops", f"{s['samples_redone']:.4g}"),
        ("job starts / stops / rescales", f"{s['job_starts']:,} / {s['job_stops']:,} / {s['rescales']:,}"),
        (
            "longest wait: to a first start (never started: to the end) / of those started / to run again",
            f"{s['longest_wait_s'] / 3600:.1f} h / {s['longest_wait_started_s'] / 3600:.1f} h / "
            f"{s['longest_rewait_s'] / 3600:.1f} h  ({s['jobs_never_started']:,} never started)",
        ),
        (
            "pilots submitted / cancelled",
            f"{s['pilots_submitted']:,} / {s['pilots_cancelled']:,}  "
            f"(the trace made a node idle {s['idle_transitions']:,} times)",
        ),
        (
            "nodes released / re-requested within 60 s",
            f"{s['nodes_released']:,} / {s['nodes_rerequested_within_60s']:,}",
        ),
        ("node-hours held by pilots", f"{s['held_node_hours']:,.1f}"),
        ("solve ms p50 / p99 / max", f"{s['solve_ms_p50']:.2f} / {s['solve_ms_p99']:.2f} / {s['solve_ms_max']:.2f}"),
        (
            "controller ms per event p50 / p99 / max",
            f"{s['controller_ms_p50']:.2f} / {s['controller_ms_p99']:.2f} / {s['controller_ms_max']:.2f}",
        ),
        ("accounting", s["accounting"]),
        ("methods", ", ".join(f"{k} {v}" for k, v in s["methods"].items()) or "—"),
        ("wall time", f"{s['wall_s']:.1f} s"),
    ]
    if "plot" in s:
        rows.append(("plot", s["plot"]))
    for k, v in rows:
        table.add_row(k, v)
    return table


def _run_dir_or_exit(run_dir: Path) -> Path:
    """``run_dir`` if it is a run directory this user can read; else one line saying what it is, and exit 2."""
    from .tui import unreadable

    why = unreadable(run_dir)
    if why is None and run_dir.is_file():
        why = (
            f"{run_dir}: is a file, not a run directory "
            "(a campaign's runs are under runs/ beside it: pilotfill top runs/<id>)"
        )
    elif why is None and not run_dir.exists():
        why = f"{run_dir}: no such run directory"
    why = why or unreadable(run_dir / "state.sqlite")
    if why is None and not (run_dir / "state.sqlite").is_file():
        why = f"{run_dir} is not a pilotfill run directory (no state.sqlite)"
    if why:
        err.print("[bold red]error:[/]", Text(why), highlight=False)
        raise typer.Exit(2)
    return run_dir


# ---------------------------------------------------------------- remote (Globus Compute)

Endpoint = Annotated[
    str, typer.Option("--endpoint", "-e", help="UUID of the Globus Compute endpoint on the login node.")
]


def _remote(call):
    from .remote import RemoteError

    try:
        return call()
    except RemoteError as exc:
        err.print("[bold red]error:[/]", Text(str(exc)), highlight=False)
        raise typer.Exit(1) from None


@app.command()
def submit(
    campaign: Annotated[Path, typer.Argument(help="The campaign file to run on the login node.")],
    endpoint: Endpoint,
    config: Annotated[
        Optional[Path], typer.Option("--config", "-c", help="Site config file shipped with the campaign.")
    ] = None,
) -> None:
    """Start a campaign on a login node through Globus Compute; prints its run id at once."""
    from . import remote

    run = _remote(lambda: remote.submit(endpoint, campaign, config))
    typer.echo(run.run_id)
    err.print(f"watch it with: pilotfill status --endpoint {endpoint} {run.run_id}", highlight=False)


@app.command()
def status(
    run: Annotated[
        str, typer.Argument(help="A run directory here, or with --endpoint the id `pilotfill submit` printed.")
    ],
    endpoint: Annotated[
        Optional[str], typer.Option("--endpoint", "-e", help="UUID of the Globus Compute endpoint of a remote run.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """A run's jobs, pilots and what it waits for: a run directory here, or a remote run (--endpoint)."""
    from . import remote

    if endpoint is None:
        run_dir = _run_dir_or_exit(Path(run))
        from .status import run_dir_status
        from .tui import RunUnreadable, read_snapshot

        try:
            _, source = read_snapshot(run_dir)
        except RunUnreadable as exc:
            err.print("[bold red]error:[/]", Text(str(exc)), highlight=False)
            raise typer.Exit(2) from None
        info = {
            "run_dir": str(run_dir),
            "phase": "running" if source == "live" else "stopped",
            **run_dir_status(run_dir),
        }
    else:
        info = _remote(lambda: remote.status(endpoint, run))
    if as_json:
        typer.echo(remote.as_json(info))
        return
    table = Table(title=f"run {run}: {info['phase']}")
    for col in ("job", "status", "nodes", "progress", "rescales", "result"):
        table.add_column(
            col, justify="right" if col in ("nodes", "progress", "rescales") else "left", overflow="ellipsis"
        )
    for j in info["jobs"]:
        shown = j.get("error") if j["status"] == JobStatus.FAILED else j.get("result")
        table.add_row(
            j["name"],
            j["status"],
            str(j["nodes"]),
            f"{j['progress']:,.0f}",
            str(j["rescales"]),
            "" if shown is None else str(shown)[:60],
        )
    Console().print(table)
    from .controller.notices import notice_line

    for notice in info.get("notices") or []:
        err.print(
            f"[{'bold red' if notice.get('level') == 'failing' else 'yellow'}]{escape(notice_line(notice) or '')}[/]",
            highlight=False,
        )
    live = [p for p in info["pilots"] if p["state"] in LIVE_PILOT_STATES]
    if live:
        pilots = Table(
            title="pilots",
            caption=f"and {len(info['pilots']) - len(live)} ended" if len(live) < len(info["pilots"]) else None,
        )
        for col in ("scheduler id", "state", "nodes"):
            pilots.add_column(col)
        for p in live:
            pilots.add_row(str(p["scheduler_id"]), p["state"], str(p["nodes"]))
        Console().print(pilots)
    elif info["pilots"]:
        err.print(f"pilots: {len(info['pilots'])} ended, none queued or running", highlight=False)


@app.command()
def results(
    run_id: Annotated[str, typer.Argument(help="The id `pilotfill submit` printed.")],
    endpoint: Endpoint,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """A remote run's finished results and its output (e.g. the NAS leaderboard)."""
    from . import remote

    info = _remote(lambda: remote.results(endpoint, run_id))
    if as_json:
        typer.echo(remote.as_json(info))
        return
    typer.echo(info["output"].rstrip())
    from .progress import plural

    err.print(f"run {run_id}: {info['phase']}, {plural(len(info['results']), 'finished job')}", highlight=False)


if __name__ == "__main__":  # pragma: no cover
    app()
