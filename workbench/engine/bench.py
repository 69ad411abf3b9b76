"""Alias kept for the documented command: ``python -m workbench.engine.bench [--tiny] ...`` runs
:mod:`workbench.bench.engine` (the engine step benchmark lives there)."""
import sys

from workbench.bench.engine import main

if __name__ == "__main__":
    sys.exit(main())
