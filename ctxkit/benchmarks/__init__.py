"""Benchmarks against peers, measured side by side (L4: uses the L3 builder and renderer)."""
