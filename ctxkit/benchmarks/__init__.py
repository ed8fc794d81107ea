"""Benchmarks against peers, measured side by side."""
