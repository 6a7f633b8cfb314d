"""A STAND-IN for the OpenPBS 23.06 commands, for tests: OpenPBS is not packaged here.

It reproduces what a real OpenPBS 23.06.06 printed and did, as recorded in
``shared/data/openpbs/real-23.06.06-recheck/`` (two MOM hosts, a normal user),
``real-23.06.06/`` (a normal user, the server's defaults) and, where those say
nothing, in the earlier capture ``shared/data/openpbs/``. Where this stand-in
and the recordings differ, THE RECORDING IS RIGHT (the recheck over
real-23.06.06, and both over the earlier one) and this file is wrong.

Recorded, and reproduced:

* layout: JSON indented with 4 spaces, ``"key":value``, lists one item per
  line; a normal user's attributes (no ``schedselect``, ``euser``, ``egroup``,
  ``hashname``, ``queue_rank``, ``queue_type``, ``run_version``; ``pbsnodes``
  without ``Port``, ``pbs_version``, ``in_multivnode_host``); the natural
  vnodes (``ncpus`` 0) listed first. Two MOM hosts ``vm`` and ``vm-n1`` with
  four one-cpu vnodes each; queues ``workq`` (priority 150) and ``scavenger``
  (10), ``preempt_order = R``; job ids ``0.vm``, ``1.vm``….
* job history OFF by default (``pbs_standin history on`` turns it on): a
  finished job vanishes (``qstat ID``: 153 "Unknown Job Id"); ``qstat -x``
  then exits 0 with a document without ``Jobs`` — even for a running job —
  and "qstat: PBS is not configured to maintain job history ID" on stderr.
  With history on a finished job stays as ``F``; ``qstat`` without ``-x`` and
  ``qdel`` of it exit 35 ("Job has finished").
* ``pbs_release_nodes``: exit 162 is PBSE_SYSTEM, for a vnode on the primary
  execution host ("Can't free … since it's on a primary execution host"), for
  a vnode not (or no longer) in the job ("Server returned error 15010 for
  job"), and for a list mixing primary and sister vnodes — then nothing is
  released. Exit 168 ("Request invalid for state of job") for ``join`` seconds
  (default 2.2, recheck (f): 2.15-2.21 s) after a multi-host job starts, while
  it shows substate 41 (recheck (d)). Releasing part of a sister host takes
  the vnodes out of ``exec_vnode`` but ``pbsnodes`` keeps them ``job-busy``
  with the job until every vnode the job had on that host is released; only
  then can another job use them. Recheck (e): a list with vnodes released
  already and held ones exits 0 and releases the held ones; released ones
  alone get 162 "error 15010"; a name never in the job, 162 "node(s)
  requested to be released not part of the job: NAME", nothing released.
* preemption (``preempt_order R``): a ``workq`` job that does not fit requeues
  rerunnable lower-priority jobs, newest first, only those on vnodes it could
  run on (recheck (a), e2e). While a victim exits it shows ``job_state`` R,
  ``substate`` 60 and its vnodes stay ``job-busy`` with it (recheck (d); not
  ``free`` as real-23.06.06 item 7 said); the main job stays ``Q``. The MOM
  SIGTERMs the victim's session once and waits until the session is empty —
  no SIGKILL (recheck (d) B: a child ignoring SIGTERM held the main job 21 s).
  Once it has exited the victim is ``Q`` with ``Exit_status`` -11 and the
  comment "Not Running: Not enough free nodes available", and has its
  ORIGINAL select back (vnodes it had released come back when it runs again,
  ``run_count`` + 1). A ``qdel`` meanwhile is lost (recheck (x)): exit 0, the
  job shows R substate 42 until it has exited, then Q, and runs again.
* ``pbs_tmrsh HOST CMD`` (recheck (c)): CMD runs detached as a task of the job
  (its own session, not pbs_tmrsh's child); pbs_tmrsh waits and exits with its
  status; a signal to pbs_tmrsh ends pbs_tmrsh only (SIGTERM: exit 0), nothing
  is forwarded. The job's end kills the tasks left (the sister MOM's
  ``kill_job``; with SIGKILL: a guess, the signal was not recorded). Every host
  is this machine, so unlike on a cluster a task's processes are visible to
  every job's processes here.
* ``qsub`` of a resource the server does not know: 187 "qsub: Unknown resource
  Resource_List.X" (recheck (g)).
* exit codes and messages of ``cli-errors.txt``: 59, 170, 153 (the error on
  stderr and an empty JSON document on stdout), a select larger than the
  machine accepted and queued forever; ``qdel`` of a finished job 35.
* site limits (``pbs_standin limit QUEUE KIND N``): ``max_queued`` and
  ``queued_jobs_threshold`` ``[u:PBS_GENERIC=N]``, refused with exit 38
  (PBSE_ENTLIMCT) and OpenPBS's own messages ("qsub: would exceed queue
  generic's per-user limit" / "… of jobs in 'Q' state", from its test suite).

Resources in a select chunk: a count asks for at least that much of the vnode's
``resources_available`` (as recorded); a string asks for that value, as the
recorded main job's ``select=1:ncpus=1:vnode=vm[0]`` took ``vm[0]``. A site's
custom string resource (e.g. ``gpu_type``, created with ``qmgr -c "create
resource gpu_type type=string, flag=h"`` and set per vnode) is modelled by
``pbs_standin init --resources vm:gpu_type=v100,vm-n1:gpu_type=k80``: every
vnode of that host shows it in ``resources_available`` and a chunk naming it
takes only vnodes with that value (custom resources were not recorded: the
matching follows PBS's documented string semantics, the ``vnode=`` case
above). A job-wide ``-l`` of a resource the server does not know exits 187
"qsub: Unknown resource Resource_List.NAME" (recorded, ``g-bad-resource-qsub-187``);
an unknown resource in a select chunk is refused the same way (# guess: not
recorded).

Not recorded, so guessed (marked ``# guess``): messages of other failures,
``Account_Name``'s place, attributes of a job that never ran, how long a
victim takes to exit without a job script (``exit`` delay, default 0),
``qdel`` of a running job (``E`` until its session is empty, SIGKILL after
``kill`` seconds, default 10, as ``kill_delay``). Not modelled: time running
out (walltime), reservations, the MOM's poll (a real main job starts 1.5-5.5 s
after the preempted pilot's exit, recheck (h); here at the next command),
refusing root (a real PBS refuses jobs from root: "qsub: Bad UID for job
execution", exit 175; tests here run as root).

Job scripts: with ``pbs_standin exec on`` a stand-in MOM runs each job's
script (under a shell, as a login shell runs it) or ``--`` command (itself the
top process) when it starts, in a session of its own, with the submitter's
environment (like ``qsub -V``; a real PBS builds a login environment) plus
``PBS_JOBID``, ``PBS_NODEFILE``…; output appended to the ``-o`` file. SIGTERM
to the session on ``qdel`` and on preemption, SIGKILL to what is left at the
kill check ``kill`` seconds later; the end is seen at once when the top
process exits last, else only at that check (the real server, turn 4: see
``reap``). With ``exec off`` (the default) scripts never run.

A "scheduler pass" first finishes exits (processes gone, delays passed), then
starts queued jobs that fit on free vnodes, highest queue priority first,
then in submission order; it runs implicitly after every command
(``pbs_standin auto off`` stops that; ``pbs_standin run`` does one).

State: one JSON file named by ``$PBS_STANDIN_STATE`` (created with the
recorded topology on first use), locked by every command; every command's
argv is appended to its ``calls`` so tests can check exactly what was run.

Test-only control command::

    pbs_standin init [--hosts vm:4,vm-n1:4] [--ncpus 1] [--ngpus 0] [--resources vm:gpu_type=v100,vm-n1:gpu_type=k80]
                                         # a fresh machine; HOST:0 = one natural vnode (Polaris style); custom string resources per host
    pbs_standin run                      # one scheduler pass
    pbs_standin preempt JOBID [SECONDS]  # a workq job that needs exactly JOBID's vnodes arrives (runs SECONDS with exec on); prints its id
    pbs_standin finish JOBID [EXIT]      # a running job ends (gone, or F with history on)
    pbs_standin hang CMD [SECONDS] [TIMES]   # CMD's next TIMES runs sleep (default 60 s, once) and do nothing
    pbs_standin slow CMD [SECONDS] [TIMES]   # CMD's next TIMES runs do their work, then sleep before answering
    pbs_standin fail CMD CODE [TIMES]    # CMD's next TIMES runs exit CODE (qstat 153: as if it did not know the jobs)
    pbs_standin auto on|off              # implicit scheduler passes
    pbs_standin history on|off           # job_history_enable: finished jobs stay as F
    pbs_standin exec on|off              # run job scripts (a stand-in MOM)
    pbs_standin delay join|exit|kill SECONDS
    pbs_standin limit QUEUE max_queued|queued_jobs_threshold N   # [u:PBS_GENERIC=N]; 0 removes it
    pbs_standin killall                  # SIGKILL every job's processes and tasks (test teardown)
"""

from __future__ import annotations

import fcntl
import getopt
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

STATE_ENV = "PBS_STANDIN_STATE"
SERVER = "vm"
VERSION = "23.06.06"
QUEUES = {"workq": 150, "scavenger": 10}
HOSTS = [("vm", 4), ("vm-n1", 4)]
NOT_ENOUGH_FREE = "Not Running: Not enough free nodes available"
# Exit codes: PBSE_* error numbers modulo 256.
MIN_GT_MAX, UNKNOWN_JOB, SYSTEM_ERROR, BAD_STATE, UNKNOWN_QUEUE = 59, 153, 162, 168, 170
FINISHED_JOB = 35  # PBSE_HISTJOBID
ENTITY_LIMIT = 38  # PBSE_ENTLIMCT
JOINING, RUNNING, RERUN = 41, 42, 60  # substates (recheck (d): a job's first ~2 s of R show 41, then 42)
NOT_IN_JOB = 162  # PBSE_SYSTEM again, with its own message (recheck (e))
UNKNOWN_RESOURCE = 187  # qsub: Unknown resource Resource_List.X (recheck (g))
# Resources this server knows (qsub refuses any other with 187). The built-in ones, plus the site's own
# "filesystems" (Polaris asks for it in every job): a guess beyond the recorded "nosuchres" refusal.
KNOWN_RESOURCES = {
    "select", "place", "walltime", "min_walltime", "max_walltime", "ncpus", "ngpus", "mem", "vmem", "nodes", "nodect", "host", "vnode",
    "arch", "mpiprocs", "ompthreads", "cput", "software", "file", "filesystems",
}
KILLED = 256 + signal.SIGTERM  # PBS's Exit_status for a job ended by a signal: 256 + signal number


class Exit(Exception):
    """A command's end: exit code, stdout, stderr."""

    def __init__(self, code: int, out: str = "", err: str = ""):
        self.code, self.out, self.err = code, out, err


# ---------------------------------------------------------------- state


def idle_vnode(now: int) -> dict:
    return {"state": "free", "jobs": [], "assigned": {}, "changed": now, "used": None}


def new_state(hosts: list[tuple[str, int]], ncpus: int = 1, ngpus: int = 0, pcpus: int = 2, custom: dict[str, dict[str, str]] | None = None) -> dict:
    now = int(time.time())
    custom = custom or {}
    vnodes: dict[str, dict] = {}
    for host, count in hosts:  # natural vnodes first, as pbsnodes lists them
        natural = {"ncpus": 0} if count else {"ncpus": ncpus * max(1, count), **({"ngpus": ngpus} if ngpus else {}), **custom.get(host, {})}
        vnodes[host] = {"host": host, "natural": True, "multi": count > 0, "resources": natural, **idle_vnode(now)}
    for host, count in hosts:
        for i in range(count):
            res = {"ncpus": ncpus, **({"ngpus": ngpus} if ngpus else {}), **custom.get(host, {})}
            vnodes[f"{host}[{i}]"] = {"host": host, "name": f"{host}[{i}]", "natural": False, "multi": True, "resources": res, **idle_vnode(now)}
    return {
        "next_id": 0, "auto": True, "history": False, "exec": False, "pcpus": pcpus, "queues": dict(QUEUES), "limits": {},
        "delays": {"join": 2.2, "exit": 0.0, "kill": 10.0}, "vnodes": vnodes, "jobs": {}, "calls": [], "faults": {},
    }  # fmt: skip


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
            state = new_state(HOSTS)
        state["path"] = path
        try:
            yield state
        finally:
            state.pop("path", None)
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(state, f)
            os.replace(tmp, path)


# ---------------------------------------------------------------- output as PBS prints it


def dumps(value, level: int = 0) -> str:
    """PBS's JSON layout (real-23.06.06): 4 spaces per level, ``"key":value``, one list item per line."""
    pad, inner = "    " * level, "    " * (level + 1)
    if isinstance(value, dict):
        if not value:
            return "{\n" + pad + "}"
        items = [f"{inner}{json.dumps(k)}:{dumps(v, level + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list):
        if not value:
            return "[\n" + pad + "]"  # guess
        return "[\n" + ",\n".join(inner + dumps(v, level + 1) for v in value) + "\n" + pad + "]"
    return json.dumps(value)


def document(key: str | None = None, body: dict | None = None) -> str:
    doc: dict = {"timestamp": int(time.time()), "pbs_version": VERSION, "pbs_server": SERVER}
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


def on_vnodes(job: dict) -> bool:
    """R (running or exiting) or E: the job has exec_vnode."""
    return job["state"] in ("R", "E")


def shown_substate(state: dict, job: dict) -> int:
    """Recheck (d), (f): for about ``join`` seconds after it turns R a job shows substate 41 (sister MOMs joining), then 42."""
    if job["state"] == "R" and job["substate"] == RUNNING and not job.get("ending") and time.time() - job.get("stime", 0) < state["delays"]["join"]:
        return JOINING
    return job["substate"]


def render_job(state: dict, job: dict) -> dict:
    """One job as ``qstat -f -F json`` prints it to a normal user, keys in the recorded order."""
    running = on_vnodes(job)
    d: dict = {"Job_Name": job["name"], "Job_Owner": job["owner"]}
    if running:
        n = sum(c.get("ncpus", 0) for c in job["orig_chunks"])  # recorded: still the whole run's ncpus after a release
        d["resources_used"] = {"cpupercent": 0, "cput": "00:00:00", "mem": "0kb", "ncpus": n, "vmem": "0kb", "walltime": hms(time.time() - job["stime"])}
    d.update(job_state=job["state"], queue=job["queue"], server=SERVER)
    if job.get("account"):
        d["Account_Name"] = job["account"]  # guess: not recorded
    d.update(Checkpoint="u", ctime=ctime(job["ctime"]), Error_Path=job["error_path"])
    if running:
        d["exec_host"] = "+".join(job["exec_host"])
        d["exec_vnode"] = "+".join(f"({v}:{chunk_text(counted(c))})" for v, c in zip(job["vnodes"], job["chunks"]))
    d.update(Hold_Types="n", Join_Path=job["join"], Keep_Files="n", Mail_Points="a", mtime=ctime(job["mtime"]), Output_Path=job["output_path"])
    d.update(Priority=0, qtime=ctime(job["ctime"]), Rerunable="True" if job["rerunable"] else "False")
    d["Resource_List"] = dict(sorted(job["resources"].items()))
    if running:
        d["stime"] = ctime(job["stime"])
    if job.get("obittime") and not running:
        d["obittime"] = ctime(job["obittime"])
    if job.get("session_id"):
        d["session_id"] = job["session_id"]
    if running:
        d["jobdir"] = job["variables"]["PBS_O_HOME"]
    d["substate"] = shown_substate(state, job)
    d["Variable_List"] = job["variables"]
    if job.get("comment"):
        d["comment"] = job["comment"]
    d["etime"] = ctime(job["ctime"])
    if job["run_count"]:
        d["run_count"] = job["run_count"]  # guess: absent before the first run
    if job.get("exit_status") is not None and not running:
        d["Exit_status"] = job["exit_status"]
    d.update(Submit_arguments=job["submit_args"], project="_pbs_project_default", Submit_Host=SERVER)
    return d


def render_vnode(state: dict, name: str, v: dict) -> dict:
    """One vnode as ``pbsnodes -av -F json`` prints it to a normal user, keys in the recorded order."""
    # Recheck (d): while a preempted job exits (R, substate 60) its vnodes stay job-busy with it, never free.
    d: dict = {"Mom": v["host"], "ntype": "PBS", "state": v["state"]}
    if v["natural"]:
        d["pcpus"] = state["pcpus"] if v["multi"] else v["resources"]["ncpus"]
    if v["jobs"]:
        d["jobs"] = list(v["jobs"])
    available = {"arch": "linux", "host": v["host"], **v["resources"], "vnode": name}
    if v["natural"] and v["multi"]:
        available["mem"] = "0b"
    d["resources_available"] = dict(sorted(available.items()))
    d["resources_assigned"] = dict(sorted(v["assigned"].items()))
    d.update(resv_enable="True", sharing="default_shared", license="l", last_state_change_time=v["changed"])
    if v["used"] is not None:
        d["last_used_time"] = v["used"]  # from the earlier capture
    return d


def counted(chunk: dict) -> dict:
    """What exec_vnode shows of a chunk: its counts, not its ``host=``/``vnode=`` (recheck (e): ``(vm[1]:ncpus=1)``)."""
    return {k: v for k, v in chunk.items() if isinstance(v, int)}


def chunk_text(chunk: dict) -> str:
    return ":".join(f"{k}={v}" for k, v in chunk.items())


# ---------------------------------------------------------------- the scheduler


def schedule(state: dict) -> None:
    """One scheduler pass: finish exits, then run what fits, highest queue priority first; preempt (requeue) lower queues for it."""
    reap(state)
    tried: set[str] = set()
    while True:
        queued = [j for j in state["jobs"].values() if j["state"] == "Q" and j["id"] not in tried]
        if not queued:
            return
        job = min(queued, key=lambda j: (-state["queues"][j["queue"]], j["queue_rank"]))
        tried.add(job["id"])
        if job.get("placed"):  # waiting for the jobs it preempted to exit
            if all(n in free_vnodes(state, job) for n in job["placed"]):
                start(state, job, job.pop("placed"))
            continue
        free = free_vnodes(state, job)
        picked = place(state, job, free)
        if picked is None:
            picked = preempt_for(state, job, free)
        if picked is None:
            job["comment"] = NOT_ENOUGH_FREE
        elif all(n in free_vnodes(state, job) for n in picked):
            start(state, job, picked)
        else:
            job["placed"] = picked


def preempt_for(state: dict, job: dict, free: list[str]) -> list[str] | None:
    """Rerun lower-priority rerunnable jobs (newest first: ``preempt_sort min_time_since_start``) until ``job`` fits;
    the vnodes it will take, or None. Only a job holding a vnode ``job`` could run on is a victim (recheck (a), e2e:
    a main job pinned to ``vm[0]`` requeued only the pilot there; one wanting any 2 vnodes, only the newest pilot)."""
    priority = state["queues"][job["queue"]]
    victims = sorted(
        (
            j for j in state["jobs"].values()
            if j["state"] == "R" and j["substate"] == RUNNING and not j.get("ending") and j["rerunable"] and state["queues"][j["queue"]] < priority
            and any(could_use(state, job, n) for n in held_vnodes(state, j))
        ),
        key=lambda j: (state["queues"][j["queue"]], -j["stime"]),
    )  # fmt: skip
    chosen: list[dict] = []
    for victim in victims:
        chosen.append(victim)
        picked = place(state, job, free + [v for c in chosen for v in held_vnodes(state, c)])
        if picked is not None:
            for c in chosen:
                begin_exit(state, c, "rerun")
            reap(state)
            return picked
    return None


def held_vnodes(state: dict, job: dict) -> list[str]:
    """Every vnode the job keeps busy, including those released from a host it still holds."""
    return [n for n, v in state["vnodes"].items() if job["id"] in v["jobs"]]


def free_vnodes(state: dict, job: dict | None = None) -> list[str]:
    """Vnodes a job could start on: no job on them, and not promised to another waiting job."""
    promised = {n for j in state["jobs"].values() if j is not job for n in j.get("placed") or ()}
    return [n for n, v in state["vnodes"].items() if v["state"] == "free" and not v["jobs"] and n not in promised]


def fits(name: str, v: dict, chunk: dict) -> bool:
    """A chunk's counts, its ``vnode=``/``host=`` (recheck (a), (c): main jobs pinned with them) and string resources
    (a site's ``gpu_type=a100``: that value) on one vnode."""
    if v["resources"].get("ncpus", 0) < 1:
        return False
    for k, val in chunk.items():
        if isinstance(val, int):
            if v["resources"].get(k, 0) < val:
                return False
        elif k == "vnode":
            if val != name:
                return False
        elif str({"host": v["host"], **v["resources"]}.get(k, "")) != val:
            return False  # host= or a string resource: that value
    return True


def known_resources(state: dict) -> set[str]:
    """The built-in resources and the site's own, defined on its vnodes (``resources_available.gpu_type``)."""
    return KNOWN_RESOURCES | {k for v in state["vnodes"].values() for k in v["resources"]}


def could_use(state: dict, job: dict, name: str) -> bool:
    """Whether ``job`` could run a chunk on vnode ``name`` (pinned jobs: only on their vnodes)."""
    if job.get("pinned"):
        return name in job["pinned"]
    return any(fits(name, state["vnodes"][name], c) for c in job["chunks"])


def place(state: dict, job: dict, free: list[str]) -> list[str] | None:
    """Vnodes for the job's chunks among ``free``, honouring ``place`` (scatter: one chunk per host; pack: one host)."""
    vnodes = state["vnodes"]
    pinned = job.get("pinned")
    if pinned:
        return list(pinned) if all(n in free for n in pinned) else None
    order = {n: i for i, n in enumerate(vnodes)}
    free = sorted(set(free), key=order.__getitem__)  # recorded: a main job took the preempted vm[0..2], not the free vm[3]
    arrangement = job["resources"]["place"].split(":")[0]
    groups = [free]
    if arrangement == "pack":
        groups = [[n for n in free if vnodes[n]["host"] == h] for h in dict.fromkeys(vnodes[n]["host"] for n in free)]
    for group in groups:
        picked: list[str] = []
        for chunk in job["chunks"]:
            used_hosts = {vnodes[n]["host"] for n in picked}
            ok = [n for n in group if n not in picked and fits(n, vnodes[n], chunk) and not (arrangement == "scatter" and vnodes[n]["host"] in used_hosts)]
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
    state.setdefault("runs", []).append({"job": job["id"], "name": job["name"], "run": job["run_count"], "vnodes": picked, "at": now})  # for tests
    job["session_id"] = 5067 + 103 * (int(job["id"].split(".")[0]) + job["run_count"])
    if "walltime" not in job["resources"] and "max_walltime" in job["resources"]:
        job["resources"]["walltime"] = job["resources"]["max_walltime"]  # recorded: nothing reserved ahead -> the full max
    job.update(state="R", substate=RUNNING, vnodes=picked, stime=now, mtime=now, exit_status=None, obittime=None, ending=None, pid=None, ending_at=None,
               released=[], tasks=[])  # fmt: skip
    on = "+".join(f"({v}:{chunk_text(counted(c))})" for v, c in zip(picked, job["chunks"]))
    job["comment"] = f"Job run at {time.strftime('%a %b %d at %H:%M', time.gmtime(now))} on {on}"
    if state["exec"]:
        spawn(state, job)


def free_job_vnodes(state: dict, job: dict, names: list[str] | None = None) -> None:
    now = int(time.time())
    for name in names if names is not None else held_vnodes(state, job):
        v = state["vnodes"][name]
        v["jobs"] = [j for j in v["jobs"] if j != job["id"]]
        if not v["jobs"]:
            v.update(state="free", assigned={}, changed=now, used=now)


def begin_exit(state: dict, job: dict, why: str) -> None:
    """A running job is told to go (``rerun``: preempted; ``delete``: qdel): SIGTERM to every process of its session.

    Recheck (d) B: on a rerun that is all — a child that ignores SIGTERM keeps the job (and the main job waiting for
    its vnodes) until it exits by itself, 20 s later; nothing SIGKILLed it. On a delete, SIGKILL follows after the
    kill delay (``kill_delay``; a guess, as "qdel -> job leaves R in 9-21 s" of real-23.06.06)."""
    now = time.time()
    job["ending"] = why
    if why == "rerun":
        job["substate"] = RERUN
    else:
        job.update(state="E", substate=50)  # guess: the exiting substate
    job["mtime"] = job["ending_at"] = now
    if job.get("pid"):
        if not job.get("argv") and set(session_members(job["pid"])) - {job["pid"]}:
            job["late"] = True  # the login shell dies of the SIGTERM before the script's processes: MOM no longer sees them
        signal_session(job["pid"], signal.SIGTERM)


def reap(state: dict) -> None:
    """Finish what has ended: exiting jobs whose session is empty, scripts that returned. The MOM follows a job by its
    session (recheck (a): a process of a session of its own is outside every job).

    The real server (tests/test_pbs_server.py, turn 4 (e)): MOM sees a job end when its top process exits — at once
    if nothing of its session is left then. If the top process goes first (a script's login shell, which the SIGTERM
    ends at once; a command that leaves children behind), MOM no longer sees the rest go and finds the session empty
    only at its kill check, ``kill`` seconds after the signal (9 s and 21 s there, "task … force exited"), where it
    SIGKILLs what is left — on a rerun as on a delete."""
    now = time.time()
    for job in list(state["jobs"].values()):
        if job["state"] not in ("R", "E"):
            continue
        pid = job.get("pid")
        alive = bool(pid) and session_alive(pid)
        if job.get("ending"):
            since = now - job["ending_at"]
            late = job.get("late") or os.path.exists(os.path.join(spool(state), f"{job['id']}.{job['run_count']}.status.orphans"))
            if alive and since >= state["delays"]["kill"]:
                signal_session(pid, signal.SIGKILL)
                alive = False
            if not alive and (pid or since >= state["delays"]["exit"]) and (not late or since >= state["delays"]["kill"]):
                finish_exit(state, job)
        elif pid and not alive:
            end(state, job, script_status(state, job))


def finish_exit(state: dict, job: dict) -> None:
    if job["ending"] == "rerun":
        requeue(state, job)
    else:
        end(state, job, KILLED)


def kill_tasks(state: dict, job: dict) -> None:
    """The job's end: its sister MOMs get KILL_JOB and run kill_job (recheck (c), MOM log of 27.vm) on the tasks
    ``pbs_tmrsh`` started. Which signal kill_job sends a live task there was not recorded: SIGKILL here (a guess)."""
    for task in job.get("tasks") or []:
        if start_ticks(task["pid"]) == task["ticks"]:
            signal_session(task["pid"], signal.SIGKILL)
    job["tasks"] = []


def requeue(state: dict, job: dict) -> None:
    """preempt_order R: "Job Rerun at request of Scheduler" — same id, back to Q with its original select, Exit_status -11."""
    kill_tasks(state, job)
    free_job_vnodes(state, job)
    state["requeues"] = state.get("requeues", 0) + 1  # for tests: how many preemptions there were
    now = time.time()
    job.update(state="Q", substate=10, vnodes=[], exec_host=[], exit_status=-11, obittime=now, mtime=now, comment=NOT_ENOUGH_FREE, ending=None, pid=None)
    job["chunks"] = [dict(c) for c in job["orig_chunks"]]
    job["resources"] = dict(job["orig_resources"], **({"walltime": job["resources"]["walltime"]} if "walltime" in job["resources"] else {}))


def end(state: dict, job: dict, exit_status: int) -> None:
    kill_tasks(state, job)
    free_job_vnodes(state, job)
    if state["history"]:
        now = time.time()
        job.update(state="F", substate=92, vnodes=[], exec_host=[], exit_status=exit_status, obittime=now, mtime=now, ending=None, pid=None)
    else:
        del state["jobs"][job["id"]]


# ---------------------------------------------------------------- the stand-in MOM (exec on)


def spool(state: dict) -> str:
    path = state["path"] + ".mom"
    os.makedirs(path, exist_ok=True)
    return path


def spawn(state: dict, job: dict) -> None:
    """Run the job's script in its own process group, as its MOM would (environment: the submitter's, like -V)."""
    d = spool(state)
    script = os.path.join(d, f"{job['id']}.SC")
    with open(script, "w") as f:
        f.write(job["script"])
    os.chmod(script, 0o700)
    nodefile = os.path.join(d, f"{job['id']}.nodes")
    with open(nodefile, "w") as f:
        f.write("".join(state["vnodes"][n]["host"] + "\n" for n in job["vnodes"]))
    status = os.path.join(d, f"{job['id']}.{job['run_count']}.status")
    env = dict(job["env"])
    env.update(PBS_JOBID=job["id"], PBS_JOBNAME=job["name"], PBS_QUEUE=job["queue"], PBS_NODEFILE=nodefile, PBS_ENVIRONMENT="PBS_BATCH",
               PBS_O_WORKDIR=job["variables"]["PBS_O_WORKDIR"], PBS_JOBDIR=job["variables"]["PBS_O_HOME"])  # fmt: skip
    out_path = job["output_path"].split(":", 1)[1]
    try:
        out = open(out_path, "a")
    except OSError:
        out = open(os.devnull, "w")
    if job.get("argv"):  # qsub … -- COMMAND: MOM runs the command itself as the job's top process
        top = [sys.executable, "-S", os.path.abspath(__file__), "--top", status, "--", *job["argv"]]
    else:  # a script: the user's login shell runs it (it is the top process, and a SIGTERM ends it at once)
        top = ["/bin/sh", "-c", '"$0"; echo $? > "$1"', script, status]
    with out:
        proc = subprocess.Popen(top, cwd=job["variables"]["PBS_O_HOME"], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    job["pid"] = proc.pid
    proc.returncode = 0  # never waited for here: the stand-in exits, the process lives on


def script_status(state: dict, job: dict) -> int:
    try:
        with open(os.path.join(spool(state), f"{job['id']}.{job['run_count']}.status")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return KILLED  # killed before it could say


def session_members(sid: int) -> list[int]:
    """Live (not zombie) processes of the session ``sid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            out.append(int(entry))
    return out


def session_alive(sid: int) -> bool:
    return bool(session_members(sid))


def signal_session(sid: int, sig: int) -> None:
    """Signal every process of the session, as the MOM signals a job's tasks (processes of other sessions escape it)."""
    for pid in session_members(sid):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


# ---------------------------------------------------------------- commands


OPTSTRINGS = {
    "qsub": "a:A:c:C:e:fhIj:J:k:l:m:M:N:o:p:P:q:r:R:S:u:v:VW:Xz",
    "qstat": "fF:QxHwtisBnp1",
    "pbsnodes": "aF:vlsjS",
    "pbs_release_nodes": "j:ak:",
    "qdel": "W:x",
    "qselect": "q:s:u:N:x",
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


def user() -> str:
    return os.environ.get("USER") or os.environ.get("LOGNAME") or "pbsuser"


def check_limits(state: dict, queue: str, owner: str) -> None:
    """The queue's [u:PBS_GENERIC=N] limits, refused as OpenPBS words it (its test suite, PBSE_ENTLIMCT)."""
    limits = state["limits"].get(queue, {})
    mine = [j for j in state["jobs"].values() if j["queue"] == queue and j["owner"] == owner and j["state"] != "F"]
    if limits.get("max_queued") and len(mine) >= limits["max_queued"]:
        raise Exit(ENTITY_LIMIT, err="qsub: would exceed queue generic's per-user limit\n")
    queued = [j for j in mine if j["state"] == "Q"]
    if limits.get("queued_jobs_threshold") and len(queued) >= limits["queued_jobs_threshold"]:
        raise Exit(ENTITY_LIMIT, err="qsub: would exceed queue generic's per-user limit of jobs in 'Q' state\n")


def qsub(state: dict, argv: list[str]) -> str:
    opts, operands = options("qsub", argv)
    queue, name, rerun, account, out, join = "workq", None, True, "", None, "n"
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
    for key in resources:
        if key not in known_resources(state):  # recheck (g): "-l nosuchres=1"
            raise Exit(UNKNOWN_RESOURCE, err=f"qsub: Unknown resource Resource_List.{key}\n")
    for chunk in parse_select(resources.get("select", "1:ncpus=1")):
        for key in chunk:
            if key not in known_resources(state):
                raise Exit(UNKNOWN_RESOURCE, err=f"qsub: Unknown resource {key}\n")  # guess: not recorded inside a select
    if "min_walltime" in resources and "max_walltime" in resources and seconds(resources["min_walltime"]) > seconds(resources["max_walltime"]):
        raise Exit(MIN_GT_MAX, err='qsub: "min_walltime" can not be greater than "max_walltime"\n')
    if not operands:
        raise Exit(2, err="qsub: stand-in needs a script or -- command\n")  # guess: real qsub would read stdin
    owner = f"{user()}@{SERVER}"
    check_limits(state, queue, owner)
    command = "--" in argv
    try:
        script = "#!/bin/sh\nexec " + shlex.join(operands) + "\n" if command else open(operands[0]).read()  # PBS copies the script at submission
    except OSError as exc:
        raise Exit(2, err=f"qsub: script file:: {exc.strerror}\n") from None  # guess
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
    name = name or ("STDIN" if command else os.path.basename(operands[0]))
    now = time.time()
    home = os.environ.get("HOME", "/")
    state["jobs"][jid] = {
        "id": jid, "name": name, "owner": owner, "queue": queue, "state": "Q", "substate": 10, "chunks": chunks,
        "orig_chunks": [dict(c) for c in chunks], "resources": resources, "orig_resources": dict(resources),
        "rerunable": rerun, "account": account, "join": join, "output_path": f"{SERVER}:{out or os.path.join(cwd, f'{name}.o{seq}')}",
        "error_path": f"{SERVER}:{os.path.join(cwd, f'{name}.e{seq}')}", "submit_args": " ".join(argv), "ctime": now, "mtime": now,
        "queue_rank": int(now * 1e6), "run_count": 0, "vnodes": [], "exec_host": [], "comment": "", "exit_status": None,
        "script": script, "argv": list(operands) if command else None, "env": dict(os.environ), "pid": None, "ending": None, "ending_at": None,
        "variables": {
            "PBS_O_HOME": home, "PBS_O_LANG": os.environ.get("LANG", "C.UTF-8"), "PBS_O_LOGNAME": user(),
            "PBS_O_PATH": os.environ.get("PATH", ""), "PBS_O_SHELL": os.environ.get("SHELL", "/bin/sh"), "PBS_O_WORKDIR": cwd,
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
        return qstat_queues(state)
    history = "-x" in flags
    if history and not state["history"]:
        # Recorded: exit 0, no Jobs at all (even for a running job), and this on stderr.
        message = "qstat: PBS is not configured to maintain job history"
        raise Exit(0, document(), "".join(f"{message} {jid}\n" for jid in ids) or message + "\n")
    errors, body, code = [], {}, 0
    queues = [q.split("@")[0] for q in ids if not q[:1].isdigit()]
    wanted = [j for j in ids if j[:1].isdigit()] or [j["id"] for j in state["jobs"].values() if not queues or j["queue"] in queues]
    for jid in wanted:
        job = state["jobs"].get(jid)
        if job is None:
            errors.append(f"qstat: Unknown Job Id {jid}\n")
            code = UNKNOWN_JOB
        elif job["state"] == "F" and not history:
            if ids:
                errors.append(f"qstat: {jid} Job has finished, use -x or -H to obtain historical job information\n")
                code = FINISHED_JOB
        else:
            body[jid] = render_job(state, job)
    out = document("Jobs", body)
    if errors:
        raise Exit(code, out, "".join(errors))
    return out


def qstat_queues(state: dict) -> str:
    """``qstat -Q -f -F json`` as in the earlier capture (the queue attributes a normal user sees were not recorded)."""
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
    return document("Queue", body)


def qselect(state: dict, argv: list[str]) -> str:
    """``qselect [-q QUEUE] [-s STATES] [-u USER]``: the ids of the matching jobs, one per line."""
    opts = dict(options("qselect", argv)[0])
    out = []
    for job in state["jobs"].values():
        if job["state"] == "F" and "-x" not in opts:
            continue
        if "-q" in opts and job["queue"] != opts["-q"].split("@")[0]:
            continue
        if "-s" in opts and job["state"] not in opts["-s"]:
            continue
        if "-u" in opts and job["owner"].split("@")[0] != opts["-u"]:
            continue
        out.append(job["id"] + "\n")
    return "".join(out)


def pbsnodes(state: dict, argv: list[str]) -> str:
    opts, _ = options("pbsnodes", argv)
    if ("-F", "json") not in opts:
        raise Exit(2, err="pbsnodes: this stand-in prints only -av -F json\n")
    return document("nodes", {n: render_vnode(state, n, v) for n, v in state["vnodes"].items()})


def pbs_release_nodes(state: dict, argv: list[str]) -> str:
    opts, names = options("pbs_release_nodes", argv)
    jid = dict(opts).get("-j", "")
    job = state["jobs"].get(jid)
    if job is None:
        raise Exit(UNKNOWN_JOB, err=f"pbs_release_nodes: Unknown Job Id {jid}\n")
    if job["state"] == "F":
        raise Exit(FINISHED_JOB, err=f"pbs_release_nodes: Job has finished {jid}\n")  # guess
    hosts = {state["vnodes"][n]["host"] for n in job["vnodes"]}
    joining = len(hosts) > 1 and time.time() - job.get("stime", 0) < state["delays"]["join"]
    if job["state"] != "R" or job["substate"] != RUNNING or job.get("ending") or joining:
        raise Exit(BAD_STATE, err="pbs_release_nodes: Request invalid for state of job \n")  # recorded for a job just started
    primary = job["exec_host"][0].split("/")[0]
    if "-a" in dict(opts):
        names = [n for n in job["vnodes"] if state["vnodes"][n]["host"] != primary]
    for name in names:
        if name in job["vnodes"] and state["vnodes"][name]["host"] == primary:
            raise Exit(SYSTEM_ERROR, err=f"pbs_release_nodes: Can't free '{name}' since it's on a primary execution host\n")
    # Recheck (e): a name never in this run of the job -> 162 naming it, nothing released; vnodes it released
    # already are skipped when others are held (exit 0), and alone -> 162 "error 15010".
    foreign = [n for n in names if n not in job["vnodes"] and n not in job.get("released", [])]
    if foreign:
        raise Exit(NOT_IN_JOB, err=f"pbs_release_nodes: node(s) requested to be released not part of the job: {' '.join(foreign)} \n")
    names = [n for n in names if n in job["vnodes"]]
    if not names:
        raise Exit(SYSTEM_ERROR, err="pbs_release_nodes: Server returned error 15010 for job \n")
    job.setdefault("released", []).extend(names)
    keep = [i for i, n in enumerate(job["vnodes"]) if n not in names]
    job["vnodes"] = [job["vnodes"][i] for i in keep]
    job["exec_host"] = [job["exec_host"][i] for i in keep]
    job["chunks"] = [job["chunks"][i] for i in keep]
    # Recorded: a vnode leaves exec_vnode at once, but stays job-busy until the job holds nothing more on its host.
    still = {state["vnodes"][n]["host"] for n in job["vnodes"]}
    free_job_vnodes(state, job, [n for n in held_vnodes(state, job) if n not in job["vnodes"] and state["vnodes"][n]["host"] not in still])
    select = "+".join(f"1:{chunk_text(c)}" for c in job["chunks"])
    job["resources"].update(select=select, nodect=len(keep), ncpus=sum(c.get("ncpus", 0) for c in job["chunks"]))
    job["mtime"] = time.time()
    return ""


def qdel(state: dict, argv: list[str]) -> str:
    opts, ids = options("qdel", argv)
    force = dict(opts).get("-W") == "force"
    errors, code = [], 0
    for jid in ids:
        job = state["jobs"].get(jid)
        if job is None:
            errors.append(f"qdel: Unknown Job Id {jid}\n")
            code = UNKNOWN_JOB
        elif job["state"] == "F":
            errors.append(f"qdel: Job has finished {jid}\n")
            code = FINISHED_JOB
        elif not on_vnodes(job):
            end(state, job, KILLED)  # guess: a queued job's Exit_status in history
        elif force:
            if job.get("pid"):
                signal_session(job["pid"], signal.SIGKILL)
            end(state, job, KILLED)
        elif job["state"] == "R" and job.get("ending") == "rerun":
            # Recheck (x): "deleting instead of rerunning", exit 0 — but the job then shows R substate 42 until the
            # MOM's obit, goes back to Q, and runs again when it can. The delete is lost.
            job["substate"], job["mtime"] = RUNNING, time.time()
        elif job["state"] == "R":
            begin_exit(state, job, "delete")
            reap(state)
        else:
            job["ending"], job["ending_at"] = "delete", job.get("ending_at") or time.time()  # already exiting: it will end
    if errors:
        raise Exit(code, err="".join(errors))
    return ""


def control(state: dict, argv: list[str]) -> str:
    """The test-only ``pbs_standin`` command (see the module docstring)."""
    what, args = (argv[0], argv[1:]) if argv else ("", [])
    if what == "init":
        opts = dict(zip(args[::2], args[1::2]))
        hosts = [(h.split(":")[0], int(h.split(":")[1])) for h in opts["--hosts"].split(",")] if "--hosts" in opts else HOSTS
        custom: dict[str, dict[str, str]] = {}
        for item in opts.get("--resources", "").split(",") if opts.get("--resources") else []:
            host, _, assignment = item.partition(":")
            key, _, value = assignment.partition("=")
            custom.setdefault(host, {})[key] = value
        keep = {k: state[k] for k in ("calls", "history", "exec", "delays", "limits", "auto") if k in state}
        state.clear()
        state.update(new_state(hosts, int(opts.get("--ncpus", 1)), int(opts.get("--ngpus", 0)), custom=custom), **keep)
    elif what == "run":
        schedule(state)
    elif what == "preempt":
        victim = job_arg(state, args)
        if victim["state"] != "R":
            raise Exit(2, err=f"pbs_standin: {victim['id']} is not running\n")
        select = "+".join(f"1:{chunk_text(c)}" for c in victim["chunks"])
        command = ["/bin/sleep", args[1]] if len(args) > 1 else ["/bin/true"]
        main = state["jobs"][qsub(state, ["-q", "workq", "-N", "mainjob", "-l", f"select={select}", "--", *command]).strip()]
        main["pinned"] = list(victim["vnodes"])
        schedule(state)
        return main["id"] + "\n"
    elif what == "finish":
        job = job_arg(state, args)
        if job.get("pid"):
            signal_session(job["pid"], signal.SIGKILL)
        end(state, job, int(args[1]) if len(args) > 1 else 0)
    elif what in ("hang", "slow", "fail"):
        if what in ("hang", "slow"):
            fault = {"kind": what, "seconds": float(args[1]) if len(args) > 1 else 60.0, "times": int(args[2]) if len(args) > 2 else 1}
        else:
            fault = {"kind": "fail", "code": int(args[1]), "times": int(args[2]) if len(args) > 2 else 1}
        state["faults"][args[0]] = fault
    elif what in ("auto", "history", "exec"):
        state[what] = args[0] == "on"
    elif what == "delay":
        state["delays"][args[0]] = float(args[1])
    elif what == "limit":
        state["limits"].setdefault(args[0], {})[args[1]] = int(args[2])
    elif what == "killall":
        state["exec"] = state["auto"] = False  # the end of a test: nothing may start after this
        for job in state["jobs"].values():
            if job.get("pid"):
                signal_session(job["pid"], signal.SIGKILL)
            kill_tasks(state, job)
    else:
        raise Exit(2, err=__doc__.split("Test-only control command::")[1])
    return ""


def job_arg(state: dict, args: list[str]) -> dict:
    if not args or args[0] not in state["jobs"]:
        raise Exit(UNKNOWN_JOB, err=f"pbs_standin: Unknown Job Id {args[0] if args else ''}\n")
    return state["jobs"][args[0]]


COMMANDS = {
    "qsub": qsub, "qstat": qstat, "qselect": qselect, "pbsnodes": pbsnodes, "pbs_release_nodes": pbs_release_nodes, "qdel": qdel,
    "pbs_standin": control,
}  # fmt: skip


def main(command: str, argv: list[str]) -> int:
    out, err, code, sleep, hang = "", "", 0, 0.0, False
    try:
        with locked_state() as state:
            state["calls"].append({"cmd": command, "argv": [command, *argv], "cwd": os.getcwd(), "at": time.time()})
            fault = state["faults"].get(command)
            if fault and fault["times"] > 0:
                fault["times"] -= 1
                if fault["kind"] == "fail" and (command, fault["code"]) == ("qstat", UNKNOWN_JOB):  # a server that lost the jobs
                    raise Exit(UNKNOWN_JOB, document(), "".join(f"qstat: Unknown Job Id {a}\n" for a in argv if a[:1].isdigit()))
                if fault["kind"] == "fail":
                    raise Exit(fault["code"], err=f"{command}: cannot connect to server {SERVER} (errno=15010)\n")  # guess
                sleep, hang = fault["seconds"], fault["kind"] == "hang"  # slept after the lock is released
            if not hang:
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
    if hang:
        return 0
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code


# ---------------------------------------------------------------- pbs_tmrsh (the TM interface's remote shell)


def _spawn_task(argv: list[str], status: str) -> int:
    """Start ``argv`` detached from the caller, in a session of its own, as a sister MOM starts a task (recheck (c):
    its parent is that host's pbs_mom, not pbs_tmrsh); its exit status goes to ``status``. Returns its pid."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the intermediate: a new session, one more fork, gone — the task is nobody's child here
        try:
            os.close(read)
            task = os.fork()
            if task == 0:
                os.close(write)
                os.setsid()
                # The shell stands for the sister MOM that waits for the task: signals to the task's session do
                # not end it (a real task's parent, pbs_mom, is not in it), so a task that dies with its parent
                # (PR_SET_PDEATHSIG) dies only when the task itself is killed.
                os.execv("/bin/sh", ["/bin/sh", "-c", 'trap : TERM INT HUP QUIT; "$@"; echo $? > "$0"', status, *argv])
            os.write(write, str(task).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        pid = int(f.read() or 0)
    os.waitpid(child, 0)
    return pid


def tmrsh(argv: list[str]) -> int:
    """``pbs_tmrsh HOST COMMAND…`` from inside a job (recheck (c)): the command runs as a task of the job on HOST,
    detached from this process; this process waits for it and exits with its status. A signal to this process
    ends this process only (SIGTERM: exit 0 within milliseconds) — nothing is forwarded: the task runs on. The
    job's end kills the tasks still running (see ``kill_tasks``). Messages of the failures: guesses."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: os._exit(0))
    if len(argv) < 2:
        sys.stderr.write("usage: pbs_tmrsh host command [args]\n")
        return 2
    host, command = argv[0], argv[1:]
    jid = os.environ.get("PBS_JOBID", "")
    try:
        with locked_state() as state:
            state["calls"].append({"cmd": "pbs_tmrsh", "argv": ["pbs_tmrsh", *argv], "cwd": os.getcwd(), "at": time.time()})
            job = state["jobs"].get(jid)
            if job is None or job["state"] not in ("R", "E"):  # guess: a job being deleted (E) still has its hosts
                raise Exit(1, err=f"pbs_tmrsh: tm_init failed, rc = TM_BADINIT (job {jid or '?'} is not running here)\n")  # guess
            if host not in {state["vnodes"][n]["host"] for n in job["vnodes"]}:
                raise Exit(1, err=f'pbs_tmrsh: host "{host}" is not a node in job <{jid}>\n')  # guess
            status = os.path.join(spool(state), f"{jid}.task.{len(state['calls'])}.status")
            pid = _spawn_task(command, status)
            job.setdefault("tasks", []).append({"pid": pid, "ticks": start_ticks(pid), "host": host})
    except Exit as e:
        sys.stderr.write(e.err)
        return e.code
    ticks = start_ticks(pid)
    while ticks is not None and start_ticks(pid) == ticks and not _zombie(pid):
        time.sleep(0.05)
    try:
        with open(status) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 0  # killed before it could say (the job's end)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def run_top(status: str, argv: list[str]) -> int:
    """An executable job's top process, as MOM sees it: ``argv`` itself (this recorder ignores the signals MOM sends the
    session and waits for it, so it never goes first), its exit status to ``status``; what ``argv`` left behind in
    the session is noted (``status.orphans``): MOM would not see it go."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)

    def defaults() -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)

    try:
        code = subprocess.Popen(argv, preexec_fn=defaults).wait()
    except OSError:
        code = 127
    if set(session_members(os.getsid(0))) - {os.getpid()}:
        open(status + ".orphans", "w").close()
    with open(status, "w") as f:
        f.write(f"{code if code >= 0 else 128 - code}\n")
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["--top"]:
    sys.exit(run_top(sys.argv[2], sys.argv[4:]))
