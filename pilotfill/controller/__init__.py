"""The controller: the event loop that decides, in its own process (``python -m pilotfill.controller``).

* :mod:`.core` — :class:`Controller`: messages through a handler table, every
  way a node goes through one ``remove_nodes``, one decision per event;
* :mod:`.world` — its working state in memory, indexed, journaled on every change;
* :mod:`.process` — the process: a ZeroMQ server, signals, the wall clock.
"""

from .core import JOB_RETRIES, Controller

__all__ = ["Controller", "JOB_RETRIES"]
