"""Helpers shared by tests and benchmarks; no test module imports another."""
