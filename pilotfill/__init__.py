"""pilotfill: pilot jobs that harvest a supercomputer's idle nodes for elastic neural-network training.

The allocator (``pilotfill.allocator``) and trace replay (``pilotfill replay``)
are here; the controller, pilots, elastic runtime and Parsl executor come in
later releases (see README).
"""

__version__ = "0.1.0"
