"""Batch-system adapters, one module per system; ``replay`` runs a recorded trace on a simulated clock."""
