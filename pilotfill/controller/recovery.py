"""Taking over from a controller that died: what it ran is gone, what the batch system still holds is adopted.

A controller's supervisor restarts it on the same run directory; the journal
says what its predecessor knew. Nothing the predecessor ran on this machine
survives it (its processes are killed), and its jobs' ranks died with it, so
every running job goes back to the queue and resumes from its last commit. The
pilots the batch system still runs are adopted (their agents reconnect and
carry on); the others are lost, their nodes removed as any node goes.
"""

from __future__ import annotations

from .. import procs
from ..pilots.manager import Ends
from ..schedulers.base import BatchScheduler
from ..state import State
from .gateway import SchedulerGateway
from .liveness import Heard
from .world import World


def take_over(world: World, journal: State, gateway: SchedulerGateway, scheduler: BatchScheduler, heard: Heard, ends: Ends, incarnation: int,
              now: float, new_campaign: bool, keep_ended_pilots: int) -> None:  # fmt: skip
    """Take over from a predecessor: nothing it ran survives; running jobs are requeued from their committed progress;
    pilots the batch system still has are adopted (heard from now), the others are lost.

    ``new_campaign``: a campaign starts anew on this run directory, so the jobs left open are held until its
    submissions claim them by call (they resume from their commits) — none runs for nobody, none runs twice.
    """
    leftovers = journal.processes()
    for p in leftovers:  # what it ran on this machine (agents of the local cluster, launchers, the store)
        procs.kill_group(p["pid"], p["start_ticks"])
    with journal.transaction():
        journal.clear_processes()
        requeued = []
        for job in list(world.open.values()):
            if job.status == "running":
                for node in world.nodes_of(job.nodes):
                    world.assign(node, None)
                world.update_job(job, status="pending", nodes=[])
                world.roll_back(job)  # its ranks died with their controller: it resumes from its commit
                requeued.append(job.id)
        if new_campaign:
            for job in list(world.open.values()):
                world.hold(job)
        live = [(p.id, p.scheduler_id) for p in world.pilots.values() if p.scheduler_id]
        adopted = set(gateway.call("adopt", scheduler.adopt, live) or []) if live else set()
        for pilot in list(world.pilots.values()):
            if pilot.id in adopted:
                heard.hear(pilot.id, now)
                continue
            ends.remove_nodes(list(pilot.nodes), now, "lost with the previous controller", "gone", event="node.lost")
            ends.end_pilot(pilot, "lost", now)
        for node in list(world.nodes.values()):
            if node.state != "gone" and node.pilot not in world.pilots:
                world.set_node_state(node, "gone", now)
            elif node.job is not None:
                world.assign(node, None)
        if leftovers or requeued or incarnation > 1:
            world.log("controller.recovered", now, incarnation=incarnation, killed=len(leftovers), requeued=requeued, adopted=sorted(adopted))
        world.log("controller.started", now, incarnation=incarnation)
        journal.prune_ended_pilots(keep_ended_pilots)
