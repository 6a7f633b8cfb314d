"""Workloads shipped with pilotfill for demos and tests."""
