"""Makers of the tests' fixtures and the benchmarks' checkpoints, run from the repository's root as modules
(``python -m scripts.make_fixtures``); the benchmarks themselves are the ``bench`` package."""
