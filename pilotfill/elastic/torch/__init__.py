"""The torch runtime (``runtime.kind = "torch"``): torch.distributed.elastic with the controller's membership.

One module per process it runs, so that a newcomer finds each by name:

* :mod:`.runtime` — ``TorchRuntime``, in the controller: starts, resizes and stops a job's agents;
* :mod:`.agent` — one torch elastic agent per node of a job (``python -m pilotfill.elastic.torch.agent``);
* :mod:`.worker` — one rank: runs the app and judges its failures by its peers;
* :mod:`.inplace` — a rank that outlives a change of membership, moving groups at a step boundary;
* :mod:`.rdzv` — the ``pilotfill`` rendezvous backend (the controller says who is in a round);
* :mod:`.store` — the run's authenticated key-value store, in place of torch's ``TCPStore``;
* :mod:`.preload` — what a worker's forkserver imports before it forks.

Importing this package imports nothing else: an agent started with ``-m`` pays only for its own module.
"""
