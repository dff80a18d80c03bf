"""Benchmarks: ratios measured side by side in one run (see bench/__main__.py)."""
