"""Pilot lifecycle: the agent inside each pilot, and the manager that sizes and releases pilots."""
