"""A STAND-IN for the OpenPBS 23.06 commands, for tests: OpenPBS is not packaged here.

It reproduces what a real OpenPBS 23.06.06 printed and did, as recorded in
``shared/data/openpbs/`` (its README.md tells the story); where this stand-in
and the recordings differ, THE RECORDING IS RIGHT and this file is wrong.

Recorded, and reproduced:

* ``qstat -f -F json`` and ``pbsnodes -av -F json``: tab-indented JSON with the
  same keys in the same order (``Jobs``/``job_state``/``exec_host``/
  ``exec_vnode``/``Resource_List`` with ``walltime`` set to ``max_walltime``/
  ``run_count``/``comment``; ``nodes``/``state``/``jobs``/``resources_available``…),
  four one-cpu vnodes ``vm[0]``..``vm[3]`` on host ``vm`` plus the natural
  vnode ``vm`` (ncpus 0), job ids ``0.vm``, ``1.vm``….
* exit codes and messages of ``cli-errors.txt``: 59 (min_walltime >
  max_walltime), 170 (unknown queue), 153 (unknown job: the error on stderr and
  an empty JSON document on stdout), 162 (a vnode on the primary execution
  host cannot be released), and a select larger than the machine accepted and
  queued forever.
* queues ``main`` (priority 150) and ``scavenger`` (10) with ``preempt_order
  = R``: a ``main`` job that does not fit requeues rerunnable lower-priority
  jobs — same id, state ``Q``, ``Exit_status`` -11, comment "Not Running: Not
  enough free nodes available" — which run again (``run_count`` + 1) when
  vnodes are free.

Not recorded, so guessed (marked ``# guess`` below): messages of other
failures, ``Account_Name``'s place, jobs that never ran, hosts with a single
vnode. Not modelled: time passing (walltime never runs out; ``finish`` ends a
job), PBS's polling delays (a requeue takes ~4 s on the real one, no time
here), job scripts (never executed), ``E`` state (``qdel`` removes at once).

A "scheduler pass" starts queued jobs that fit on free vnodes, highest queue
priority first, then in submission order; it runs implicitly after every
command (``pbs_standin auto off`` stops that; ``pbs_standin run`` does one).

State: one JSON file named by ``$PBS_STANDIN_STATE`` (created with the recorded
topology on first use), locked by every command; every command's argv is
appended to its ``calls`` so tests can check exactly what was run.

Test-only control command::

    pbs_standin init [--hosts vm:4] [--ncpus 1] [--ngpus 0]  # a fresh machine; HOST:0 = one natural vnode (Polaris style)
    pbs_standin run                      # one scheduler pass
    pbs_standin preempt JOBID            # a main-queue job that needs exactly JOBID's vnodes arrives; prints its id
    pbs_standin finish JOBID [EXIT]      # a running job ends (gone, or F with history on)
    pbs_standin hang CMD [SECONDS] [TIMES]   # CMD's next TIMES runs sleep (default 60 s, once)
    pbs_standin fail CMD CODE [TIMES]    # CMD's next TIMES runs exit CODE
    pbs_standin auto on|off              # implicit scheduler passes
    pbs_standin history on|off           # job_history_enable: finished jobs stay as F
"""

from __future__ import annotations

import fcntl
import getopt
import json
import os
import sys
import time
from contextlib import contextmanager

STATE_ENV = "PBS_STANDIN_STATE"
SERVER = "vm"
VERSION = "23.06.06"
QUEUES = {"main": 150, "scavenger": 10}
NOT_ENOUGH_FREE = "Not Running: Not enough free nodes available"
# Exit codes (PBSE_* error numbers modulo 256), cli-errors.txt.
MIN_GT_MAX, UNKNOWN_JOB, PRIMARY_HOST, UNKNOWN_QUEUE = 59, 153, 162, 170
FINISHED_JOB = 35  # guess: PBSE_HISTJOBID (15139), qstat without -x on a finished job when history is on


class Exit(Exception):
    """A command's end: exit code, stdout, stderr."""

    def __init__(self, code: int, out: str = "", err: str = ""):
        self.code, self.out, self.err = code, out, err


# ---------------------------------------------------------------- state


def idle_vnode(now: int) -> dict:
    return {"state": "free", "jobs": [], "assigned": {}, "changed": now, "used": None}


def new_state(hosts: list[tuple[str, int]], ncpus: int = 1, ngpus: int = 0, pcpus: int = 2) -> dict:
    now = int(time.time())
    vnodes: dict[str, dict] = {}
    for host, count in hosts:
        natural = {"ncpus": 0} if count else {"ncpus": ncpus * max(1, count), **({"ngpus": ngpus} if ngpus else {})}
        vnodes[host] = {"host": host, "natural": True, "multi": count > 0, "resources": natural, **idle_vnode(now)}
        for i in range(count):
            res = {"ncpus": ncpus, **({"ngpus": ngpus} if ngpus else {})}
            vnodes[f"{host}[{i}]"] = {"host": host, "natural": False, "multi": True, "resources": res, **idle_vnode(now)}
    return {"next_id": 0, "auto": True, "history": False, "pcpus": pcpus, "queues": dict(QUEUES), "vnodes": vnodes, "jobs": {}, "calls": [], "faults": {}}


@contextmanager
def locked_state():
    path = os.environ.get(STATE_ENV)
    if not path:
        raise Exit(2, err=f"pbs stand-in: set {STATE_ENV} to the state file\n")
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path) as f:
                state = json.load(f)
        except FileNotFoundError:
            state = new_state([(SERVER, 4)])
        try:
            yield state
        finally:
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(state, f)
            os.replace(tmp, path)


# ---------------------------------------------------------------- output as PBS prints it


def dumps(value, level: int = 0) -> str:
    """PBS's JSON layout: one tab per level, ``"key":<TAB>value``, lists on one line, ``{`` + newline for empty objects."""
    if isinstance(value, dict):
        pad = "\t" * (level + 1)
        if not value:
            return "{\n" + "\t" * level + "}"
        items = [f"{pad}{json.dumps(k)}:\t{dumps(v, level + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + "\t" * level + "}"
    if isinstance(value, list):
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    return json.dumps(value)


def document(state: dict, key: str | None = None, body: dict | None = None) -> str:
    doc = {"timestamp": int(time.time()), "pbs_version": VERSION, "pbs_server": SERVER}
    if key is not None and body:
        doc[key] = body
    return dumps(doc) + "\n"


def ctime(t: float | None) -> str:
    return time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(t))


def hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def seconds(text: str) -> int:
    parts = [int(p) for p in text.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]


def render_job(job: dict) -> dict:
    """One job as ``qstat -f -F json`` prints it, keys in the recorded order."""
    running = job["state"] in ("R", "E")
    d: dict = {"Job_Name": job["name"], "Job_Owner": job["owner"]}
    if running:
        n = sum(c.get("ncpus", 0) for c in job["chunks"])
        d["resources_used"] = {"cpupercent": 0, "cput": "00:00:00", "mem": "5608kb", "ncpus": n, "vmem": "9032kb", "walltime": hms(time.time() - job["stime"])}
    d.update(job_state=job["state"], queue=job["queue"], server=SERVER)
    if job.get("account"):
        d["Account_Name"] = job["account"]  # guess: not recorded
    d.update(Checkpoint="u", ctime=ctime(job["ctime"]), Error_Path=job["error_path"])
    if running:
        d["exec_host"] = "+".join(job["exec_host"])
        d["exec_vnode"] = "+".join(f"({v}:{chunk_text(c)})" for v, c in zip(job["vnodes"], job["chunks"]))
    d.update(Hold_Types="n", Join_Path=job["join"], Keep_Files="n", Mail_Points="a", mtime=ctime(job["mtime"]), Output_Path=job["output_path"])
    d.update(Priority=0, qtime=ctime(job["ctime"]), Rerunable="True" if job["rerunable"] else "False")
    d["Resource_List"] = dict(sorted(job["resources"].items()))
    d["schedselect"] = job["resources"]["select"]
    if running:
        d["stime"] = ctime(job["stime"])
    if job.get("obittime") and not running:
        d["obittime"] = ctime(job["obittime"])
    if job.get("session_id"):
        d["session_id"] = job["session_id"]
    if running:
        d["jobdir"] = job["variables"]["PBS_O_HOME"]
    d["substate"] = {"R": 42, "E": 51, "F": 92}.get(job["state"], 10)
    d["Variable_List"] = job["variables"]
    d.update(euser=job["owner"].split("@")[0], egroup=job["owner"].split("@")[0], hashname=job["id"], queue_rank=job["queue_rank"], queue_type="E")
    if job.get("comment"):
        d["comment"] = job["comment"]
    d["etime"] = ctime(job["ctime"])
    if job["run_count"]:
        d["run_count"] = job["run_count"]  # guess: absent before the first run
    if job.get("exit_status") is not None and not running:
        d["Exit_status"] = job["exit_status"]
    d.update(Submit_arguments=job["submit_args"], project="_pbs_project_default", run_version=max(1, job["run_count"]), Submit_Host=SERVER)
    return d


def render_vnode(state: dict, name: str, v: dict) -> dict:
    """One vnode as ``pbsnodes -av -F json`` prints it, keys in the recorded order."""
    d: dict = {"Mom": v["host"], "Port": 15002, "pbs_version": VERSION, "ntype": "PBS", "state": v["state"]}
    if v["natural"]:
        d["pcpus"] = state["pcpus"] if v["multi"] else v["resources"]["ncpus"]
    if v["jobs"]:
        d["jobs"] = list(v["jobs"])
    available = {"arch": "linux", "host": v["host"], **v["resources"], "vnode": name}
    if v["natural"] and v["multi"]:
        available["mem"] = "0b"
    d["resources_available"] = dict(sorted(available.items()))
    d["resources_assigned"] = dict(sorted(v["assigned"].items()))
    d.update(resv_enable="True", sharing="default_shared")
    if v["multi"]:
        d["in_multivnode_host"] = 1
    d.update(license="l", last_state_change_time=v["changed"])
    if v["used"] is not None:
        d["last_used_time"] = v["used"]
    return d


def chunk_text(chunk: dict) -> str:
    return ":".join(f"{k}={v}" for k, v in chunk.items())


# ---------------------------------------------------------------- the scheduler


def schedule(state: dict) -> None:
    """One scheduler pass: run what fits, highest queue priority first; preempt (requeue) lower queues for it."""
    tried: set[str] = set()
    while True:
        queued = [j for j in state["jobs"].values() if j["state"] == "Q" and j["id"] not in tried]
        if not queued:
            return
        job = min(queued, key=lambda j: (-state["queues"][j["queue"]], j["queue_rank"]))
        tried.add(job["id"])
        free = free_vnodes(state)
        picked = place(state, job, free)
        if picked is None:
            priority = state["queues"][job["queue"]]
            victims = sorted(
                (j for j in state["jobs"].values() if j["state"] == "R" and j["rerunable"] and state["queues"][j["queue"]] < priority),
                key=lambda j: (state["queues"][j["queue"]], -j["stime"]),
            )
            chosen: list[dict] = []
            for victim in victims:
                chosen.append(victim)
                if place(state, job, free + [v for c in chosen for v in c["vnodes"]]) is not None:
                    break
            else:
                chosen = []
            if chosen:
                for victim in chosen:
                    requeue(state, victim)
                picked = place(state, job, free_vnodes(state))
        if picked is None:
            job["comment"] = NOT_ENOUGH_FREE
        else:
            start(state, job, picked)


def free_vnodes(state: dict) -> list[str]:
    return [n for n, v in state["vnodes"].items() if v["state"] == "free" and not v["jobs"]]


def fits(v: dict, chunk: dict) -> bool:
    if v["resources"].get("ncpus", 0) < 1:
        return False
    return all(v["resources"].get(k, 0) >= val for k, val in chunk.items() if isinstance(val, int))


def place(state: dict, job: dict, free: list[str]) -> list[str] | None:
    """Vnodes for the job's chunks among ``free``, honouring ``place`` (scatter: one chunk per host; pack: one host)."""
    vnodes = state["vnodes"]
    pinned = job.get("pinned")
    if pinned:
        return list(pinned) if all(n in free for n in pinned) else None
    arrangement = job["resources"]["place"].split(":")[0]
    groups = [free]
    if arrangement == "pack":
        groups = [[n for n in free if vnodes[n]["host"] == h] for h in dict.fromkeys(vnodes[n]["host"] for n in free)]
    for group in groups:
        picked: list[str] = []
        for chunk in job["chunks"]:
            used_hosts = {vnodes[n]["host"] for n in picked}
            ok = [n for n in group if n not in picked and fits(vnodes[n], chunk) and not (arrangement == "scatter" and vnodes[n]["host"] in used_hosts)]
            if not ok:
                break
            picked.append(ok[0])
        else:
            return picked
    return None


def start(state: dict, job: dict, picked: list[str]) -> None:
    now = time.time()
    per_host: dict[str, int] = {}
    job["exec_host"] = []
    for name, chunk in zip(picked, job["chunks"]):
        v = state["vnodes"][name]
        v.update(state="job-busy", jobs=[job["id"]], assigned={k: val for k, val in chunk.items() if isinstance(val, int)}, changed=int(now))
        k = per_host.get(v["host"], 0)
        per_host[v["host"]] = k + 1
        cpus = chunk.get("ncpus", 1)
        job["exec_host"].append(f"{v['host']}/{k}" + (f"*{cpus}" if cpus > 1 else ""))
    job["run_count"] += 1
    job["session_id"] = 26432 + 103 * (int(job["id"].split(".")[0]) + job["run_count"])
    if "walltime" not in job["resources"] and "max_walltime" in job["resources"]:
        job["resources"]["walltime"] = job["resources"]["max_walltime"]  # recorded: nothing reserved ahead -> the full max
    job.update(state="R", vnodes=picked, stime=now, mtime=now, exit_status=None, obittime=None)
    on = "+".join(f"({v}:{chunk_text(c)})" for v, c in zip(picked, job["chunks"]))
    job["comment"] = f"Job run at {time.strftime('%a %b %d at %H:%M', time.gmtime(now))} on {on}"


def free_job_vnodes(state: dict, job: dict, names: list[str] | None = None) -> None:
    now = int(time.time())
    for name in names if names is not None else job.get("vnodes", []):
        v = state["vnodes"][name]
        v["jobs"] = [j for j in v["jobs"] if j != job["id"]]
        if not v["jobs"]:
            v.update(state="free", assigned={}, changed=now, used=now)


def requeue(state: dict, job: dict) -> None:
    """preempt_order R: "Job Rerun at request of Scheduler" — same id, back to Q, Exit_status -11."""
    free_job_vnodes(state, job)
    now = time.time()
    job.update(state="Q", vnodes=[], exec_host=[], exit_status=-11, obittime=now, mtime=now, comment=NOT_ENOUGH_FREE)


def end(state: dict, job: dict, exit_status: int) -> None:
    free_job_vnodes(state, job)
    if state["history"]:
        now = time.time()
        job.update(state="F", vnodes=[], exec_host=[], exit_status=exit_status, obittime=now, mtime=now)
    else:
        del state["jobs"][job["id"]]


# ---------------------------------------------------------------- commands


OPTSTRINGS = {
    "qsub": "a:A:c:C:e:fhIj:J:k:l:m:M:N:o:p:P:q:r:R:S:u:v:VW:Xz",
    "qstat": "fF:QxHwtisBnp1",
    "pbsnodes": "aF:vlsjS",
    "pbs_release_nodes": "j:ak:",
    "qdel": "W:x",
}


def options(command: str, argv: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """POSIX getopt as the PBS commands parse: (option, value) pairs, then operands (``--`` ends options)."""
    try:
        return getopt.getopt(argv, OPTSTRINGS[command])
    except getopt.GetoptError as exc:
        raise Exit(2, err=f"{command}: {exc}\nusage: see the PBS manual\n") from None


def parse_select(text: str) -> list[dict]:
    chunks = []
    for spec in text.split("+"):
        parts = spec.split(":")
        count = int(parts[0]) if parts[0].isdigit() else 1
        res = {}
        for p in parts[1:] if parts[0].isdigit() else parts:
            k, _, v = p.partition("=")
            res[k] = int(v) if v.isdigit() else v
        chunks += [dict(res) for _ in range(count)]
    return chunks


def qsub(state: dict, argv: list[str]) -> str:
    opts, operands = options("qsub", argv)
    queue, name, rerun, account, out, join = "scavenger", None, True, "", None, "n"
    resources: dict = {}
    for opt, val in opts:
        if opt == "-q":
            queue = val
        elif opt == "-N":
            name = val
        elif opt == "-r":
            rerun = val == "y"
        elif opt == "-A":
            account = val
        elif opt == "-o":
            out = val
        elif opt == "-j":
            join = val
        elif opt == "-l":
            for item in val.split(","):
                k, _, v = item.partition("=")
                resources[k] = v
    if queue not in state["queues"]:
        raise Exit(UNKNOWN_QUEUE, err="qsub: Unknown queue\n")
    if "min_walltime" in resources and "max_walltime" in resources and seconds(resources["min_walltime"]) > seconds(resources["max_walltime"]):
        raise Exit(MIN_GT_MAX, err='qsub: "min_walltime" can not be greater than "max_walltime"\n')
    if not operands:
        raise Exit(2, err="qsub: stand-in needs a script or -- command\n")  # guess: real qsub would read stdin
    jid = f"{state['next_id']}.{SERVER}"
    seq = state["next_id"]
    state["next_id"] += 1
    select = resources.get("select", "1:ncpus=1")
    chunks = parse_select(select)
    resources["select"] = select
    resources.setdefault("place", "free")
    resources["nodect"] = len(chunks)
    for key in ("ncpus", "ngpus"):
        total = sum(c.get(key, 0) for c in chunks if isinstance(c.get(key, 0), int))
        if total or key == "ncpus":
            resources[key] = total
    cwd = os.getcwd()
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or "pfuser"
    name = name or os.path.basename(operands[0])
    now = time.time()
    state["jobs"][jid] = {
        "id": jid, "name": name, "owner": f"{user}@{SERVER}", "queue": queue, "state": "Q", "chunks": chunks, "resources": resources,
        "rerunable": rerun, "account": account, "join": join, "output_path": f"{SERVER}:{out or os.path.join(cwd, f'{name}.o{seq}')}",
        "error_path": f"{SERVER}:{os.path.join(cwd, f'{name}.e{seq}')}", "submit_args": " ".join(argv), "ctime": now, "mtime": now,
        "queue_rank": int(now * 1e6), "run_count": 0, "vnodes": [], "exec_host": [], "comment": "", "exit_status": None,
        "variables": {
            "PBS_O_HOME": os.environ.get("HOME", "/"), "PBS_O_LANG": os.environ.get("LANG", "C.UTF-8"), "PBS_O_LOGNAME": user,
            "PBS_O_PATH": os.environ.get("PATH", ""), "PBS_O_MAIL": f"/var/mail/{user}", "PBS_O_SHELL": os.environ.get("SHELL", "/bin/sh"),
            "PBS_O_INTERACTIVE_AUTH_METHOD": "resvport", "PBS_O_INTERACTIVE_ENCRYPT_METHOD": "", "PBS_O_WORKDIR": cwd,
            "PBS_O_SYSTEM": "Linux", "PBS_O_QUEUE": queue, "PBS_O_HOST": SERVER,
        },
    }  # fmt: skip
    return jid + "\n"


def qstat(state: dict, argv: list[str]) -> str:
    opts, ids = options("qstat", argv)
    flags = {o for o, _ in opts}
    if ("-F", "json") not in opts or "-f" not in flags:
        raise Exit(2, err="qstat: this stand-in prints only -f -F json\n")
    if "-Q" in flags:
        body = {}
        for q, prio in state["queues"].items():
            jobs = [j for j in state["jobs"].values() if j["queue"] == q and j["state"] != "F"]
            count = {s: sum(1 for j in jobs if j["state"] == s) for s in "QRE"}
            running = [j for j in jobs if j["state"] == "R"]
            body[q] = {
                "queue_type": "Execution", "Priority": prio, "total_jobs": len(jobs),
                "state_count": f"Transit:0 Queued:{count['Q']} Held:0 Waiting:0 Running:{count['R']} Exiting:{count['E']} Begun:0 ",
                "resources_assigned": {"ncpus": sum(j["resources"]["ncpus"] for j in running), "nodect": sum(j["resources"]["nodect"] for j in running)},
                "enabled": "True", "started": "True",
            }  # fmt: skip
        return document(state, "Queue", body)
    errors, body, code = [], {}, 0
    shown = [j["id"] for j in state["jobs"].values() if j["state"] != "F" or "-x" in flags]
    for jid in ids or shown:
        job = state["jobs"].get(jid)
        if job is None:
            errors.append(f"qstat: Unknown Job Id {jid}\n")
            code = UNKNOWN_JOB
        elif job["state"] == "F" and "-x" not in flags:
            errors.append(f"qstat: {jid} Job has finished, use -x or -H to obtain historical job information\n")  # guess
            code = FINISHED_JOB
        else:
            body[jid] = render_job(job)
    out = document(state, "Jobs", body)
    if errors:
        raise Exit(code, out, "".join(errors))
    return out


def pbsnodes(state: dict, argv: list[str]) -> str:
    opts, _ = options("pbsnodes", argv)
    if ("-F", "json") not in opts:
        raise Exit(2, err="pbsnodes: this stand-in prints only -av -F json\n")
    return document(state, "nodes", {n: render_vnode(state, n, v) for n, v in state["vnodes"].items()})


def pbs_release_nodes(state: dict, argv: list[str]) -> str:
    opts, names = options("pbs_release_nodes", argv)
    jid = dict(opts).get("-j", "")
    job = state["jobs"].get(jid)
    if job is None:
        raise Exit(UNKNOWN_JOB, err=f"pbs_release_nodes: Unknown Job Id {jid}\n")  # guess
    if job["state"] != "R":
        raise Exit(UNKNOWN_JOB, err=f"pbs_release_nodes: Request invalid for state of job {jid}\n")  # guess
    if "-a" in dict(opts):
        primary = state["vnodes"][job["vnodes"][0]]["host"]
        names = [n for n in job["vnodes"] if state["vnodes"][n]["host"] != primary]
    primary = job["exec_host"][0].split("/")[0]
    for name in names:
        if name not in job["vnodes"]:
            raise Exit(1, err=f"pbs_release_nodes: node(s) requested to be released not part of the job: {name}\n")  # guess
        if state["vnodes"][name]["host"] == primary:
            raise Exit(PRIMARY_HOST, err=f"pbs_release_nodes: Can't free '{name}' since it's on a primary execution host\n")
    keep = [i for i, n in enumerate(job["vnodes"]) if n not in names]
    free_job_vnodes(state, job, names)
    job["vnodes"] = [job["vnodes"][i] for i in keep]
    job["exec_host"] = [job["exec_host"][i] for i in keep]
    job["chunks"] = [job["chunks"][i] for i in keep]
    select = "+".join(f"1:{chunk_text(c)}" for c in job["chunks"])
    job["resources"].update(select=select, nodect=len(keep), ncpus=sum(c.get("ncpus", 0) for c in job["chunks"]))
    job["mtime"] = time.time()
    return ""


def qdel(state: dict, argv: list[str]) -> str:
    _, ids = options("qdel", argv)
    errors = []
    for jid in ids:
        job = state["jobs"].get(jid)
        if job is None or job["state"] == "F":
            errors.append(f"qdel: Unknown Job Id {jid}\n")
        else:
            end(state, job, 271)  # guess: a deleted running job's Exit_status (SIGTERM)
    if errors:
        raise Exit(UNKNOWN_JOB, err="".join(errors))
    return ""


def control(state: dict, argv: list[str]) -> str:
    """The test-only ``pbs_standin`` command (see the module docstring)."""
    what, args = (argv[0], argv[1:]) if argv else ("", [])
    if what == "init":
        opts = dict(zip(args[::2], args[1::2]))
        hosts = [(h.split(":")[0], int(h.split(":")[1])) for h in opts.get("--hosts", f"{SERVER}:4").split(",")]
        calls = state["calls"]
        state.clear()
        state.update(new_state(hosts, int(opts.get("--ncpus", 1)), int(opts.get("--ngpus", 0))), calls=calls)
    elif what == "run":
        schedule(state)
    elif what == "preempt":
        victim = job_arg(state, args)
        if victim["state"] != "R":
            raise Exit(2, err=f"pbs_standin: {victim['id']} is not running\n")
        select = "+".join(f"1:{chunk_text(c)}" for c in victim["chunks"])
        main = state["jobs"][qsub(state, ["-q", "main", "-N", "mainjob", "-l", f"select={select}", "--", "/bin/true"]).strip()]
        main["pinned"] = list(victim["vnodes"])
        schedule(state)
        return main["id"] + "\n"
    elif what == "finish":
        job = job_arg(state, args)
        end(state, job, int(args[1]) if len(args) > 1 else 0)
    elif what in ("hang", "fail"):
        if what == "hang":
            fault = {"kind": "hang", "seconds": float(args[1]) if len(args) > 1 else 60.0, "times": int(args[2]) if len(args) > 2 else 1}
        else:
            fault = {"kind": "fail", "code": int(args[1]), "times": int(args[2]) if len(args) > 2 else 1}
        state["faults"][args[0]] = fault
    elif what in ("auto", "history"):
        state[what] = args[0] == "on"
    else:
        raise Exit(2, err=__doc__.split("Test-only control command::")[1])
    return ""


def job_arg(state: dict, args: list[str]) -> dict:
    if not args or args[0] not in state["jobs"]:
        raise Exit(UNKNOWN_JOB, err=f"pbs_standin: Unknown Job Id {args[0] if args else ''}\n")
    return state["jobs"][args[0]]


COMMANDS = {"qsub": qsub, "qstat": qstat, "pbsnodes": pbsnodes, "pbs_release_nodes": pbs_release_nodes, "qdel": qdel, "pbs_standin": control}


def main(command: str, argv: list[str]) -> int:
    out, err, code, sleep = "", "", 0, 0.0
    try:
        with locked_state() as state:
            state["calls"].append({"cmd": command, "argv": [command, *argv], "cwd": os.getcwd()})
            fault = state["faults"].get(command)
            if fault and fault["times"] > 0:
                fault["times"] -= 1
                if fault["kind"] == "fail":
                    raise Exit(fault["code"], err=f"{command}: cannot connect to server {SERVER} (errno=15010)\n")  # guess
                sleep = fault["seconds"]  # slept after the lock is released, so other commands go on
            else:
                if state["auto"]:
                    schedule(state)
                try:
                    out = COMMANDS[command](state, argv)
                finally:
                    if state["auto"]:
                        schedule(state)
    except Exit as e:
        out, err, code = e.out, e.err, e.code
    if sleep:
        time.sleep(sleep)
        return 0
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code
