"""The process helpers every agent and keeper ends with (pilotfill/procs.py)."""

from __future__ import annotations

import os
import time
import subprocess
import sys

import pytest

from pilotfill import procs

pytestmark = pytest.mark.unit


def in_a_session_of_its_own(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` as the leader of a new session (as MOM starts a batch job's top process); it must succeed."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, start_new_session=True)
    assert out.returncode == 0, out.stderr
    return out


def test_a_process_that_leads_no_session_leaves_its_session_alone():
    """``settle_session`` SIGKILLs what is left of a batch job's session. Run by a process that does not lead its
    session (an agent started in a test or from a shell), that session is the shell's, make's, CI's: an agent run
    in-process by the test suite once killed the CI run that started it. It must touch nothing there. (Checked in a
    session of its own: were it wrong, it would kill only that session.)"""
    code = (
        "import subprocess, sys, time\n"
        "sibling = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "settler = subprocess.run([sys.executable, '-c', 'import os; from pilotfill import procs; "
        "assert os.getsid(0) != os.getpid(); print(procs.settle_session(timeout_s=0.1))'], capture_output=True, text=True)\n"
        "time.sleep(0.3)\n"
        "print(settler.returncode, settler.stdout.strip(), sibling.poll(), flush=True)\n"
        "sibling.kill()\n"
    )
    out = in_a_session_of_its_own(code)
    assert out.stdout.split() == ["0", "[]", "None"], "a member of a session the caller does not lead was killed"


def test_a_session_leader_settles_its_session():
    """The batch job's top process (a session leader, as MOM starts it) leaves nothing behind when it exits."""
    code = (
        "import subprocess, sys, os\n"
        "from pilotfill import procs\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "left = procs.settle_session(timeout_s=0.2)\n"
        "print(left, flush=True)\n"
    )
    out = in_a_session_of_its_own(code)
    child, left = out.stdout.split("\n")[:2]
    assert left == "[]"
    stat = f"/proc/{child}/stat"
    assert not os.path.exists(stat) or open(stat).read().rsplit(")", 1)[1].split()[0] in "ZX"


def test_a_child_whose_parent_died_before_it_asked_to_die_with_it_goes_at_once():
    """``die_with_parent`` runs in the child after the fork. A parent killed in between (a controller stopping as it
    starts a pilot) never sends the kernel's SIGKILL, and the child lived on: a pilot agent left behind on the
    site. The child now checks who its parent is after asking, and goes. Here the parent exits between the fork and
    the call; the child must die by SIGKILL, not run on to write its marker."""
    code = (
        "import os, signal, sys, time\n"
        "from pilotfill import procs\n"
        "r, w = os.pipe()\n"
        "middle = os.fork()\n"
        "if middle == 0:\n"
        "    child = os.fork()\n"
        "    if child == 0:\n"
        "        os.close(w)\n"
        "        os.read(r, 1)  # the middle process has exited: this child is now someone else's\n"
        "        procs.die_with_parent()\n"
        "        print('survived', flush=True)\n"
        "        os._exit(0)\n"
        "    print(child, flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(middle, 0)\n"
        "os.close(w)  # the child's read returns now\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    child = int(out.stdout.split()[0])
    deadline = time.time() + 60
    while time.time() < deadline and procs.alive(child):
        time.sleep(0.05)
    assert "survived" not in out.stdout and not procs.alive(child), "the orphan outlived the parent that started it"
