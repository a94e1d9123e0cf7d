"""Shale's benchmarks. Each compares Shale with a baseline in the same run: ``python -m bench [name ...]``."""
