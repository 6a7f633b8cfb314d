"""``python -m pilotfill`` is the ``pilotfill`` command."""

from .cli import app

app(prog_name="pilotfill")
