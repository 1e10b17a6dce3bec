"""The benchmark scripts' functions, reused (not copied): scripts/bench is put on sys.path, as the
scripts themselves do, and the module imported by name. This works from a checkout (the editable install
the project uses); the benchmarks are not part of an installed wheel."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench"


def bench(name: str) -> ModuleType:
    """scripts/bench/NAME.py as a module."""
    if not (BENCH / f"{name}.py").exists():
        raise ImportError(f"no benchmark {name} in {BENCH} (wansync reproduce needs the project's checkout)")
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)
