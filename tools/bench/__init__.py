"""Benchmarks, run as modules from the repository root: `python -m tools.bench.bench_grpo_step ...`."""
