"""A warm process a pilot keeps on its node: torch and pilotfill's torch runtime imported once, forked for each job.

A torch job's agent on a node that joins the job used to start cold: a new
Python importing torch, then a forkserver for its workers importing torch again
— seconds before the node trained (issue 58; ``benchmarks/bench_pbs.py`` times a
grow on the real OpenPBS). A pilot whose
campaign runs torch jobs (the run directory's ``warm.json`` says so; the torch
runtime writes it) starts this *zygote* as soon as it starts, before any job is
placed on it: it imports what every torch job's agent and workers need, then
waits. The pilot agent's launcher asks it for each torch agent it starts on this
node (:class:`Zygote`): the zygote forks, and the child — torch already imported,
no thread started yet — runs the agent, which forks its workers' forkserver from
itself in turn (:func:`pilotfill.elastic.torch.agent.start_forkserver`).

A forked agent is what :func:`pilotfill.procs.spawn` would have started: its own
session, its output through a pipe the launcher reads (capped and rotated like
any rank's log), its environment the launcher's, dying with the zygote, which
dies with the pilot's agent. The launcher learns its exit status from the
zygote over the request's connection.

    python -m pilotfill.pilots.warm --socket PATH      # the pilot's agent starts it; it serves until the agent goes
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ..elastic.launch import LocalLauncher, _Running

WARM_FILE = "warm.json"
"""In the run directory: what the campaign's jobs need warm on every pilot (``{"torch": true}``)."""
MODULES = (
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "torch.nn.parallel",
    "torch.distributed.elastic.multiprocessing",
    "pilotfill.elastic.torch.agent",
    "pilotfill.elastic.torch.worker",
    "pilotfill.elastic.torch.inplace",
    "pilotfill.elastic.state",
    "pilotfill.elastic.loader",
    "pilotfill.elastic.run_store",
    "pilotfill.report",
    "pilotfill.transport",
)
"""What the zygote imports: a torch agent's and its workers' imports (preload.py's, without its signal settings)."""
RUNS = {"pilotfill.elastic.torch.agent"}
"""The modules a zygote runs (``python -m M``: ``M.main(argv)``); anything else is started cold."""


def wanted(run_dir: str | Path) -> bool:
    """Whether this run's pilots keep a warm torch (its torch runtime asked)."""
    try:
        return bool(json.loads((Path(run_dir) / WARM_FILE).read_text()).get("torch"))
    except (OSError, ValueError, AttributeError):
        return False


def want(run_dir: str | Path) -> None:
    """The torch runtime's word to every pilot of the run: keep torch warm (written once, atomically)."""
    path = Path(run_dir) / WARM_FILE
    if wanted(run_dir):
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps({"torch": True}))
        os.replace(tmp, path)


# ------------------------------------------------------------------ the launcher's side


class WarmProcess:
    """A process the zygote forked, as the launcher sees it (the part of ``subprocess.Popen`` it uses)."""

    def __init__(self, pid: int, conn: socket.socket):
        self.pid, self._conn, self.returncode = pid, conn, None
        self.stdout = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(block=False)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                import subprocess

                raise subprocess.TimeoutExpired(f"warm process {self.pid}", timeout or 0.0)
            self._read(block=True, timeout=0.05)
        assert self.returncode is not None
        return self.returncode

    def _read(self, block: bool, timeout: float = 0.0) -> None:
        try:
            self._conn.settimeout(timeout if block else 0.0)
            data = self._conn.recv(256)
        except (BlockingIOError, socket.timeout, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.returncode = -signal.SIGKILL  # the zygote went without saying: its children died with it
        else:
            with contextlib.suppress(ValueError, KeyError):
                self.returncode = int(json.loads(data.decode().splitlines()[0])["exit"])
        with contextlib.suppress(OSError):
            self._conn.close()


class Zygote:
    """The launcher's handle on its pilot's zygote (started by the pilot's agent, dying with it)."""

    def __init__(self, socket_path: Path, proc: Any):
        self.path, self.proc = socket_path, proc

    @classmethod
    def start(cls, log_path: str | None, run_dir: str | Path) -> Zygote:
        """A zygote serving on a socket in a private directory of this node's (a socket's path is short: not the run's).
        Its environment names the run: what it forks keeps the environment it was started with (``/proc/PID/environ``),
        so they are found as the run's processes, as a cold start's are."""
        import tempfile

        from .. import procs

        path = Path(tempfile.mkdtemp(prefix="pilotfill-warm-")) / "zygote.sock"
        env = {**os.environ, "PILOTFILL_RUN_DIR": str(run_dir)}
        proc = procs.spawn(
            [sys.executable, "-m", "pilotfill.pilots.warm", "--socket", str(path)], env=env, log_path=log_path
        )
        return cls(path, proc)

    def ready(self) -> bool:
        """Whether it serves (its imports done): until then a launch starts cold."""
        return self.proc.poll() is None and self.path.exists()

    def runs(self, argv: list[str]) -> bool:
        """Whether ``argv`` is something it starts warm: this Python running one of :data:`RUNS`."""
        return len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and argv[2] in RUNS and self.ready()

    def spawn(self, argv: list[str], env: dict[str, str], log_path: str | None, log_limit_bytes: int) -> WarmProcess:
        """Fork ``argv`` from the zygote: :func:`pilotfill.procs.spawn`'s process, warm."""
        import threading

        from .. import procs

        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(30.0)
        conn.connect(str(self.path))
        read, write = os.pipe() if log_path else (-1, os.open(os.devnull, os.O_WRONLY))
        try:
            request = json.dumps({"module": argv[2], "argv": argv[3:], "env": env, "cwd": os.getcwd()}).encode() + b"\n"
            socket.send_fds(conn, [request], [write])
        finally:
            os.close(write)
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = conn.recv(256)
            if not chunk:
                if read >= 0:
                    os.close(read)
                raise OSError("the pilot's warm process closed the connection before starting the process")
            reply += chunk
        pid = int(json.loads(reply.decode())["pid"])
        if read >= 0:
            pipe = os.fdopen(read, "rb")  # buffered: pump_log reads with read1
            threading.Thread(
                target=procs.pump_log,
                args=(pipe, str(log_path), int(log_limit_bytes)),
                name="pilotfill-log",
                daemon=True,
            ).start()
        return WarmProcess(pid, conn)

    def close(self) -> None:
        from .. import procs

        if self.proc.poll() is None:
            procs.kill_group(self.proc.pid)
            self.proc.wait()
        self.path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()


# ------------------------------------------------------------------ the zygote


def serve(path: Path) -> None:
    """Import, then fork a child per request; tell each request's connection its child's pid, then its exit status."""
    import importlib

    for name in MODULES:
        importlib.import_module(name)
    children: dict[int, socket.socket] = {}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    listener.bind(str(tmp))
    os.chmod(tmp, 0o600)
    listener.listen(16)
    os.replace(tmp, path)  # the launcher takes the socket's presence for "warm"
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    print(f"warm: {', '.join(MODULES[:1])} and pilotfill's torch runtime imported; serving at {path}", flush=True)
    while True:
        for key, _ in selector.select(timeout=1.0):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                pid = _fork(conn, listener, wake_r, wake_w)
                if pid is not None:
                    children[pid] = conn
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                    conn.close()


def _fork(conn: socket.socket, listener: socket.socket, wake_r: int, wake_w: int) -> int | None:
    """One request: its command and the write end of its log pipe; the child runs it, the parent answers its pid."""
    conn.settimeout(30.0)
    try:
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 1)
        request = json.loads(message.decode())
    except (OSError, ValueError):
        conn.close()
        return None
    out = fds[0] if fds else os.open(os.devnull, os.O_WRONLY)
    pid = os.fork()
    if pid == 0:  # the child: the process the launcher asked for
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)  # the zygote's own; the child installs what it needs
            listener.close()
            conn.close()
            for fd in (wake_r, wake_w):
                os.close(fd)
            code = _run(request, out)
        finally:
            os._exit(code)
    os.close(out)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    return pid


def _run(request: dict[str, Any], out: int) -> int:
    """In the forked child: become what ``python -m MODULE ARGV`` with ``env`` would be, and run it."""
    import importlib

    from ..procs import die_with_parent

    os.setsid()  # its own session: its whole group can be signalled, as procs.spawn's
    die_with_parent()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    for fd in (devnull, out):
        if fd > 2:
            os.close(fd)
    env = {str(k): str(v) for k, v in request["env"].items()}
    os.environ.clear()
    os.environ.update(env)
    for entry in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if entry not in sys.path:
            sys.path.insert(0, entry)  # what the interpreter would have put first for a new process
    with contextlib.suppress(OSError):
        os.chdir(request.get("cwd") or "/")
    module = request["module"]
    sys.argv = [module, *request["argv"]]
    code = importlib.import_module(module).main(list(request["argv"]))
    sys.stdout.flush()
    sys.stderr.flush()
    return int(code or 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pilotfill.pilots.warm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True)
    args = ap.parse_args(argv)
    from ..procs import die_with_parent

    die_with_parent()  # it goes with the pilot's agent, and what it forked with it
    # Slurm signals every process of a preempted job, not only its top one: a zygote that went at SIGTERM took the torch
    # agents it forked along (they die with it), and their workers died in the middle of a step instead of leaving at
    # the next boundary. It goes when the pilot's agent does, after the workers had their grace.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve(Path(args.socket))
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------------------------ the pilot agent's launcher


class WarmLauncher(LocalLauncher):
    """The pilot agent's launcher: a process its zygote can start warm (a torch agent) is forked from it (``warm``, set
    once the zygote serves); anything else, or anything while it is not there, starts cold."""

    warm: Zygote | None = None

    def launch(self, host: str, job_id: str, argv: list[str], env: dict[str, str]) -> None:
        from .. import procs

        if self.warm is None or not self.warm.runs(argv):
            return super().launch(host, job_id, argv, env)
        if (host, job_id) in self._running:
            self.terminate(host, job_id)
            self._reap(host, job_id, wait=True)
        log = str(self.log_path(host, job_id)) if self.log_dir is not None else None
        try:
            proc = self.warm.spawn(argv, {**self.base_env, **env, "PILOTFILL_HOST": host}, log, procs.LOG_LIMIT_BYTES)
        except OSError:
            return super().launch(host, job_id, argv, env)  # the warm process is gone: cold
        with self._lock:
            self._running[(host, job_id)] = _Running(proc, procs.start_ticks(proc.pid))
