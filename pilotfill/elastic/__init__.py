"""Runtimes that start, resize and stop the ranks of training jobs on pilot nodes."""
