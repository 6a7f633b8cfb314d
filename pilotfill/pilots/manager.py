"""The fill strategy: pilots sized to demand, from the same decision that moves nodes.

After every allocation the controller asks one question of the allocator —
"if the nodes our queued pilots asked for and the nodes the main workload
leaves idle were all ready, how many would the jobs use?" — and this module
turns the answer into what the site sees:

* more than we hold or have asked for: submit pilots for the difference (never
  more than is idle, within the site's limits: queued pilots, submissions per
  minute, a back-off after a refusal);
* fewer than we hold: give back ready nodes no job uses — at once when no
  open job could grow onto them, else once they have gone unused for
  ``release_after_s`` (a job that ends usually frees nodes another one wants a
  moment later: releasing in between and asking again is the thrash a site sees);
* fewer than we hold plus what is queued: cancel queued pilots no job needs.

A submission the batch system refuses (a queue limit) or that fails is asked
again when the back-off it logged has passed, and until one succeeds it is
:attr:`PilotManager.problem`: the batch system's words, which ``pilotfill run``
and ``pilotfill top`` show. One that can never work (a resource or queue the
server does not know) is :attr:`PilotManager.fatal`: the controller stops with
that line rather than asking for the same thing again and again.

Release and fill never both happen in one decision, and a node is released
only when the jobs would not use it even with every idle node — nor ask for it
again once given back, as a new pilot's node (valued over a fresh node's hold,
which can be longer than an old one's): so pilotfill never gives a node back
while the same jobs wait for one, and never asks for a node it just gave back.

On a machine with several kinds of node all of this is done per type, from one
question ("with every idle node of every type, how many of each would the jobs
use?"): each pilot asks for one type, within the same site limits.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from ..allocator import Allocation
from ..config import PilotConfig
from ..lifecycle import Removal
from ..reasons import NodeWhy
from ..schedulers.base import NothingIdle, PilotRefused, SchedulerConfigError
from ..schedulers.commands import reason_of

if TYPE_CHECKING:
    from ..controller.gateway import SchedulerGateway
    from ..controller.notices import Notices
    from ..controller.world import Pilot, World

log = logging.getLogger("pilotfill.pilots")

REFUSED_BACKOFF_S = (10.0, 300.0)
"""After the batch system refuses a submission: wait this long before asking again, doubling up to the second value."""


SUBMIT_BATCH = 128
"""Pilots one pass of the controller's loop submits: a wave of thousands of idle nodes is asked for in passes, so no
reply or decision waits behind a thousand submissions (the rest follow in the next passes, unless a decision sizes
the pilots anew first)."""

RELEASE_BATCH = 128
"""Pilots one pass of the loop gives nodes back from: the nodes of thousands of one-node pilots that no job needs any
more (the jobs of a campaign done) are released in passes, as pilots are submitted (the rest follow in the next passes,
unless a sizing decides anew first): each release is a batch-system call and the nodes' removal."""

RELEASE_RETRY_S = 5.0
"""A release the batch system failed or declined is asked again no sooner than this (never every tick)."""
REREQUEST_WINDOW_S = 60.0
"""A node given back and asked for again within this long is thrash a site sees (what the replay counts)."""


class Question(Protocol):
    """The one question the pilots ask of the jobs (the controller answers it with the allocator)."""

    def wanted(self, extra: int, answer: Allocation | None, without: tuple[str, ...] = ()) -> int:
        """Nodes the jobs would use with ``extra`` more ready (``without`` these nodes of ours)."""

    def wanted_types(
        self, extra: dict[str, int], answer: Allocation | None, without: tuple[str, ...] = ()
    ) -> dict[str, int]:
        """The same per node type."""

    def job_ending_within(self, seconds: float) -> bool:
        """Whether a running job is about to end (and free nodes another one may want)."""


class Ends(Protocol):
    """How nodes and pilots end: the controller's one way for each, so that every job that held them hears of it."""

    def remove_nodes(
        self,
        names: Iterable[str],
        now: float,
        why: NodeWhy,
        to: Removal,
        deadline: float | None = None,
        event: str | None = None,
        taken: bool = False,
        detail: object = None,
    ) -> None: ...

    def end_pilot(self, pilot: Pilot, state: str, now: float) -> None: ...


class PilotManager:
    """Submits, releases and cancels pilots; depends on the world, the batch system's gateway, the question and the
    ends, not on the controller."""

    def __init__(
        self,
        world: World,
        config: PilotConfig,
        gateway: SchedulerGateway,
        question: Question,
        ends: Ends,
        incarnation: int,
        wake: Callable[[str], None],
        notices: Notices,
    ):
        self.world = world
        self.notices = notices
        self.config = config
        self.gateway = gateway
        self.question = question
        self.ends = ends
        self.incarnation = incarnation
        self.wake = wake
        self._asked_at: dict[str, float] = {}  # queued pilot -> when submitted
        self._release: dict[str, set[str]] = {}  # pilot -> nodes to drop, told at its next heartbeat
        # node no decision wants -> since when (released after release_after_s)
        self._unused_since: dict[str, float] = {}
        self._submits: deque[float] = deque()  # times of recent submissions (per-minute limit)
        self._not_before = 0.0
        self._backoff = 0.0
        self._retry_told = True  # retry_due() said so once for the current back-off
        self._limited_until: float | None = None  # a submission the per-minute limit held back: sized again then
        # the last submission's refusal or failure, until one succeeds (shown to the user)
        self.problem: dict | None = None
        self.fatal: SchedulerConfigError | None = None  # a refusal no retry can change: the controller stops
        self._pilot_seq = int(self.world.journal.get_meta("pilot_seq", "0") or 0)
        # node type (None: one kind) -> nodes the last sizing asks for, not yet submitted
        self._owed: dict[str | None, int] = {}
        # nodes the last sizing gives back, not yet released (past RELEASE_BATCH pilots)
        self._owed_release: list[str] = []

    # ------------------------------------------------------------ what the controller asks

    def arrived(self, pilot: Pilot, now: float) -> None:
        self._asked_at.pop(pilot.id, None)

    def arriving(self, now: float, window_s: float) -> bool:
        """True while pilots asked for less than ``window_s`` ago have not registered."""
        stale = [p for p in self._asked_at if p not in self.world.queued]
        for p in stale:
            del self._asked_at[p]
        return any(now - t < window_s for t in self._asked_at.values())

    def released(self, pilot: str) -> list[str]:
        """Nodes the pilot's agent should stop holding (drained once told)."""
        return sorted(self._release.pop(pilot, set()))

    def has_release(self, pilot: str) -> bool:
        return bool(self._release.get(pilot))

    @property
    def owed(self) -> bool:
        """Whether the last sizing asked for more pilots than one pass submits (:data:`SUBMIT_BATCH`), or gave back the
        nodes of more pilots than one pass releases (:data:`RELEASE_BATCH`)."""
        return bool(self._owed or self._owed_release)

    def settle_owed(self, now: float) -> None:
        """Submit the next :data:`SUBMIT_BATCH` pilots the last sizing asked for (within the site's limits), and release
        the nodes of the next :data:`RELEASE_BATCH` pilots it gave back that are still unused."""
        owed, self._owed = self._owed, {}
        for node_type, nodes in owed.items():
            self._submit(nodes, now, node_type)
        release, self._owed_release = self._owed_release, []
        world = self.world
        release = [n for n in release if n in world.ready and world.nodes[n].job is None]
        if release:
            self._give_back(release, now)

    def forget_owed(self) -> None:
        """Nothing more is submitted or released in passes (the controller is stopping: every pilot ends)."""
        self._owed, self._owed_release = {}, []

    def adjust(
        self, now: float, idle: int, answer: Allocation | None = None, idle_types: dict[str, int] | None = None
    ) -> None:
        """Release, cancel or submit so that what we hold and ask for matches what the jobs would use, type by type
        (``idle_types``: a machine with several kinds of node; a machine of one kind is sized as one type, None)."""
        # sized anew: what an earlier sizing still owed is asked again below, if still wanted
        self._owed, self._owed_release = {}, []
        world = self.world
        typed = idle_types is not None
        idle_of: dict[str | None, int] = dict(idle_types) if typed else {None: idle}
        ready: dict[str | None, int] = (
            {t: 0 for t in sorted(set(idle_of) | {p.node_type for p in world.queued.values() if p.node_type})}
            if typed
            else {None: 0}
        )
        unused: dict[str | None, list[str]] = {t: [] for t in ready}
        for name in world.ready:
            node = world.nodes[name]
            t = node.node_type if typed else None
            if typed and t is None:
                continue
            ready[t] = ready.get(t, 0) + 1
            if node.job is None:
                unused.setdefault(t, []).append(name)
        pending = {t: world.pending_nodes(t) for t in ready}
        if not any(unused.values()):
            self._unused_since.clear()
        if not (any(unused.values()) or any(idle_of.values()) or any(pending.values())):
            # everything held is used and nothing more could be had: nothing to size
            self._waiting(self._jobs_waiting(), now)
            return
        if answer is None and not world.open and not any(unused.values()) and not any(pending.values()):
            self._waiting(0, now)
            return
        extra = {t: idle_of.get(t, 0) + pending.get(t, 0) for t in ready}
        wanted = self._wanted(extra, answer) if world.open else {}
        spare = []
        for t in ready:
            surplus = ready[t] - wanted.get(t, 0)
            if surplus > 0:
                spare += unused.get(t, [])[:surplus]
        self._unused_since = {n: self._unused_since.get(n, now) for n in spare}
        if spare:
            hold = self.config.release_after_s if self._could_grow() else 0.0
            due = [n for n in spare if now - self._unused_since[n] >= hold]
            if due and hold > 0 and self.question.job_ending_within(REREQUEST_WINDOW_S):
                # a job about to end frees nodes that, with these, may make a growth worth it: asked again then
                due = []
            if due and world.open:
                due = self._not_wanted_again(due, extra, ready, pending, typed)
            if due:
                self._give_back(due, now)
        missing = {}
        for t in ready:
            want = wanted.get(t, 0)
            if pending[t] - max(0, want - ready[t]) > 0 and want <= ready[t]:
                self._cancel_queued(now, t)
            missing[t] = want - ready[t] - pending[t]
        for t in ready:
            self._ask_for(missing[t], idle_of.get(t, 0), now, t, waiting=sum(m for m in missing.values() if m > 0))

    def _wanted(
        self, extra: dict[str | None, int], answer: Allocation | None, without: tuple[str, ...] = ()
    ) -> dict[str | None, int]:
        """The pilots' question, per type: what the jobs would use with ``extra`` more nodes of each (one kind:
        None)."""
        if None in extra:
            return {None: self.question.wanted(extra[None], answer, without=without)}
        return self.question.wanted_types(extra, answer, without=without)

    def _not_wanted_again(
        self,
        due: list[str],
        extra: dict[str | None, int],
        ready: dict[str | None, int],
        pending: dict[str | None, int],
        typed: bool,
    ) -> list[str]:
        """Of the nodes about to be given back, those the jobs would not ask for again, type by type: given back, they
        would be idle nodes, and the jobs would be asked about them as new ones (a new pilot's, valued over a fresh
        node's hold) — releasing a node and asking for it back is the thrash a site sees."""
        by_type: dict[str | None, list[str]] = {}
        for name in due:
            by_type.setdefault(self.world.nodes[name].node_type if typed else None, []).append(name)
        more = {t: extra.get(t, 0) + len(by_type.get(t, ())) for t in extra}
        again = self._wanted(more, None, without=tuple(due))
        going = []
        for t, names in by_type.items():
            going += names[max(0, again.get(t, 0) - (ready.get(t, 0) - len(names)) - pending.get(t, 0)) :]
        return going

    def _ask_for(
        self, missing: int, idle: int, now: float, node_type: str | None = None, waiting: int | None = None
    ) -> None:
        """Submit pilots for the ``missing`` nodes the idle ones can give; with none idle, the campaign waits for one
        (``waiting``: the nodes wanted of every type)."""
        if missing > 0 and idle > 0:
            self._submit(min(missing, idle), now, node_type)
        else:
            self._waiting(missing if waiting is None else waiting, now, "more wanted")

    def _jobs_waiting(self) -> int:
        """Open jobs that hold no node: waiting to start."""
        return sum(1 for job in self.world.open.values() if not job.nodes)

    def _waiting(self, count: int, now: float, what: str = "jobs waiting") -> None:
        """Say that the campaign waits for an idle node (``count`` of ``what``), or stop saying it when nothing waits;
        a refusal or a failure being said is not replaced."""
        if count > 0 and (self.problem is None or self.problem["kind"] == "waiting"):
            self._set_problem(
                "waiting",
                f"{count} {what if count != 1 or what != 'jobs waiting' else 'job waiting'}, none idle",
                "",
                now,
                None,
            )
        elif count <= 0 and self.problem is not None and self.problem["kind"] == "waiting":
            self._set_problem(None, "", "", now, None)

    def release_due(self, now: float) -> bool:
        """True when a node kept unused has waited ``release_after_s``: time to decide again whether to give it back."""
        wait = max(self.config.release_after_s, RELEASE_RETRY_S)
        owed = set(self._owed_release)  # given back already, released in the next passes: not a reason to size again
        return any(now - t >= wait for n, t in self._unused_since.items() if n not in owed)

    def retry_due(self, now: float) -> bool:
        """True once when a refused or failed submission's back-off has passed: time to size the pilots again."""
        if self.problem is None or self._retry_told or now < self._not_before:
            return False
        self._retry_told = True
        return True

    def limit_due(self, now: float) -> bool:
        """True once when a submission the per-minute limit held back may be made: nothing else may happen by then
        (no event, no change of idle nodes), and a job would wait for a node it could have forever."""
        if self._limited_until is None or now < self._limited_until:
            return False
        self._limited_until = None
        return True

    def _could_grow(self) -> bool:
        """Whether an open job could still take another node (below its maximum, or waiting to start)."""
        return any(len(job.nodes) < job.spec["max_nodes"] for job in self.world.open.values())

    # ------------------------------------------------------------ acting

    def _give_back(self, nodes: list[str], now: float) -> None:
        """Release ``nodes`` (ready, unused), grouped by pilot, those of :data:`RELEASE_BATCH` pilots now and the rest
        in the next passes (:meth:`settle_owed`); what the batch system keeps stays held."""
        by_pilot: dict[str, list[str]] = {}
        for name in nodes:
            pilot = self.world.nodes[name].pilot
            if pilot is not None:
                by_pilot.setdefault(pilot, []).append(name)
        if len(by_pilot) > RELEASE_BATCH:
            later = list(by_pilot)[RELEASE_BATCH:]
            self._owed_release += [name for pilot in later for name in by_pilot.pop(pilot)]
        for pilot, names in by_pilot.items():
            given = self.gateway.call("release", self.gateway.scheduler.release, pilot, names)
            given = [n for n in given if n in names] if given is not None else []
            for name in names:
                if name not in given:  # failed (logged with its command) or kept by the batch system: asked again later
                    self._unused_since[name] = now
            if not given:
                continue
            self.ends.remove_nodes(given, now, NodeWhy.RELEASED, Removal.GONE, event="node.released")
            for name in given:
                self._unused_since.pop(name, None)
            self.world.count("nodes_released", len(given))
            self._release.setdefault(pilot, set()).update(given)
            self.wake(pilot)  # its agent ends what runs there and lets the nodes go now

    def _cancel_queued(self, now: float, node_type: str | None = None) -> None:
        for pilot in list(self.world.queued.values()):
            if node_type is not None and pilot.node_type != node_type:
                continue
            if (
                self.gateway.call("cancel", self.gateway.scheduler.cancel, pilot.id) is None
                and pilot.scheduler_id is None
            ):
                continue
            self.world.log("pilot.cancelled", now, pilot=pilot.id, why="no job needs it any more")
            self.world.count("pilots_cancelled")
            self.ends.end_pilot(pilot, "ended", now)
            self._asked_at.pop(pilot.id, None)

    def _set_problem(self, kind: str | None, reason: str, error: str, now: float, retry_at: float | None) -> None:
        """What ``pilotfill run`` and ``top`` show until a submission succeeds (a notice: controller/notices.py)."""
        self.problem = (
            {"kind": kind, "reason": reason, "error": error[-1000:], "at": now, "retry_at": retry_at} if kind else None
        )
        if kind is None:
            self.notices.clear("pilots")
        elif kind == "waiting":
            self.notices.say("pilots", f"waiting for an idle node ({reason})", now, level="waiting")
        else:
            what = "pilot refused" if kind == "refused" else "pilot submission failed"
            self.notices.say("pilots", f"{what}: {reason or error or '?'}", now, retry_at=retry_at)

    def _submit(self, nodes: int, now: float, node_type: str | None = None) -> None:
        """Submit pilots for ``nodes`` nodes (of ``node_type``), ``nodes_per_pilot`` at a time,
        within the site's limits."""
        if now < self._not_before:
            return
        cfg = self.config
        while self._submits and now - self._submits[0] >= 60.0:
            self._submits.popleft()
        asked = submitted = 0
        while asked < nodes:
            if submitted >= SUBMIT_BATCH:
                self._owed[node_type] = nodes - asked  # the next pass submits the rest
                break
            submitted += 1
            if len(self.world.queued) >= cfg.max_queued_pilots:
                break  # a queued pilot's start or end is an event: sized again then
            if len(self._submits) >= cfg.max_submits_per_minute:
                self._limited_until = self._submits[0] + 60.0
                break
            size = min(cfg.nodes_per_pilot, nodes - asked)
            self._pilot_seq += 1
            pilot_id = f"p{self.incarnation}-{self._pilot_seq}"
            self.world.journal.set_meta("pilot_seq", str(self._pilot_seq))
            try:
                if node_type is None:
                    scheduler_id = self.gateway.scheduler.submit_pilot(pilot_id, size)
                else:
                    scheduler_id = self.gateway.scheduler.submit_pilot(pilot_id, size, node_type=node_type)
            except NothingIdle as exc:  # the machine is full: nothing failed; asked again when a node is idle
                if self.problem is None or self.problem["kind"] != "waiting":
                    self.world.log("pilot.waiting", now, reason=exc.reason)
                self._set_problem("waiting", exc.reason, str(exc), now, None)
                return
            except SchedulerConfigError as exc:  # the same answer every time: stop, naming the config key
                log.error("pilot submission refused for good: %s", exc)
                self.world.log("pilot.submit_refused", now, error=str(exc)[-1000:], reason=exc.reason, final=True)
                self._set_problem("refused", exc.reason, str(exc), now, None)
                self.fatal = exc
                return
            except Exception as exc:  # refused or failed: back off rather than ask again every tick
                self._backoff = min(REFUSED_BACKOFF_S[1], max(REFUSED_BACKOFF_S[0], self._backoff * 2))
                self._not_before = now + self._backoff
                self._retry_told = False
                kind = "refused" if isinstance(exc, PilotRefused) else "failed"
                log.warning("pilot submission %s (next try in %.0f s): %s", kind, self._backoff, exc)
                self.world.log(
                    f"pilot.submit_{kind}", now, error=str(exc)[-1000:], reason=reason_of(exc), retry_in_s=self._backoff
                )
                self._set_problem(kind, reason_of(exc), str(exc), now, self._not_before)
                return
            self._backoff = 0.0
            if self.problem is not None:
                self._set_problem(None, "", "", now, None)
            self._submits.append(now)
            self.world.add_pilot(pilot_id, scheduler_id, size, now, self.incarnation, node_type)
            self.world.log(
                "pilot.submitted",
                now,
                pilot=pilot_id,
                scheduler_id=scheduler_id,
                nodes=size,
                **({"node_type": node_type} if node_type else {}),
            )
            self.world.count("pilots_submitted")
            self._asked_at[pilot_id] = now
            asked += size
