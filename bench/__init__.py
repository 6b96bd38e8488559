"""The benchmark tool: ``python -m bench SUITE [options]``, one entry point per suite on one request and load
library, each run written as a record under bench/runs/ (bench/record.py); ``python -m bench page`` makes
docs/benchmarks.md from the records. See docs/benchmarks.md for the suites and how each runs."""
