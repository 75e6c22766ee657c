"""Benchmark drivers behind ``hotloop bench``."""
