"""Horovod's own ``hvd.elastic.run`` loop, with what a rank of the Horovod runtime sets before the app runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit


def test_a_removal_is_followed_by_a_sync_like_any_change(horovod):
    """horovod/horovod#3494: after a removal only, survivors skip the sync; a rank added to the same new group syncs,
    and the group hangs. Run in a fresh process: the fix changes Horovod's interrupt class for the process."""
    script = textwrap.dedent("""
        import sys
        from pilotfill.elastic.horovod_sync import always_sync
        if sys.argv[1] == "fixed":
            assert always_sync()
        from horovod.common.elastic import run_fn
        from horovod.common.exceptions import HostsUpdatedInterrupt

        class State:
            syncs = 0
            def sync(self): State.syncs += 1
            def on_reset(self): pass
            def on_hosts_updated(self, timestamp, update): pass

        calls = []
        def train(state):
            calls.append(1)
            if len(calls) == 1:
                raise HostsUpdatedInterrupt(skip_sync=True)  # what check_host_updates raises after a removal only
            return "done"

        import horovod.common.elastic as elastic
        elastic.notification_manager.init = lambda *a, **k: None  # no driver here to be told by
        print(run_fn(train, reset=lambda: None)(State()), State.syncs)
    """)
    def syncs(mode: str) -> str:
        out = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()
    assert syncs("as-shipped") == ["done", "1"]  # Horovod's own: the removal's round skipped the sync
    assert syncs("fixed") == ["done", "2"]
