#!/usr/bin/env python
"""Measure every gradient strategy on every model: peak memory, step time, largest batch.

The command line, its modes and the rest live in ``benchmark_lib`` (see its docstring);
``python benchmark.py --help`` lists the arguments, strategies and models.
"""
import sys

from benchmark_lib.cli import main

if __name__ == "__main__":
    sys.exit(main())
