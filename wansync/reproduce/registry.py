"""Which experiments each paper has: a named function of (cell, seed) returning a flat dict of figures,
the cells of the full and the quick campaign, and what the summary and figure compare."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

PAPERS = ("netstorm", "packing", "selmcast", "selective", "crew")
Figures = dict[str, Any]
RunFn = Callable[[dict[str, Any], int], Figures]


@dataclass(frozen=True)
class Experiment:
    """One figure or table of a paper. `fn(cell, seed)` returns numbers plus `valid` and `live` (bools);
    `ratios` are (name, numerator, denominator) figures divided per run (so paired per seed); `plot` the
    panels of the figure, each `a+b+...` figures (or ratio names) drawn against the cell's `x` as lines, one
    line per figure and value of the `series` keys."""

    paper: str
    id: str
    title: str  # the paper's figure and what it shows
    fn: RunFn
    cells: Sequence[dict[str, Any]]
    x: str
    plot: Sequence[str]
    quick_cells: Sequence[dict[str, Any]] | None = None  # None: the same as the full campaign
    ratios: Sequence[tuple[str, str, str]] = ()
    series: Sequence[str] = ()
    live: bool = False
    seeded: bool = True  # False: the result does not depend on the seed (one run per cell is enough)
    table: Sequence[str] = ()  # the summary table's columns (default: ratios + plot)
    shape: str = ""  # the paper's shape, in a sentence
    extra: dict[str, Any] = field(default_factory=dict)

    def cells_for(self, quick: bool) -> list[dict[str, Any]]:
        return [dict(c) for c in (self.quick_cells if quick and self.quick_cells is not None else self.cells)]

    def columns(self) -> list[str]:
        plotted = [k for p in self.plot for k in p.split("+")]
        return list(self.table) or list(dict.fromkeys([*(r[0] for r in self.ratios), *plotted]))


_REGISTRY: dict[str, dict[str, Experiment]] = {}
_MODULES = {p: f"wansync.reproduce.papers.{p}" for p in PAPERS}


def register(exp: Experiment) -> Experiment:
    """Add `exp` to its paper (an id is unique within a paper)."""
    exps = _REGISTRY.setdefault(exp.paper, {})
    if exp.id in exps:
        raise ValueError(f"{exp.paper}: experiment {exp.id} registered twice")
    exps[exp.id] = exp
    return exp


def experiments(paper: str) -> dict[str, Experiment]:
    """Every experiment of `paper`, in registration order (importing its module registers them)."""
    module = _MODULES.get(paper)
    if module is None and paper not in _REGISTRY:
        raise KeyError(f"unknown paper {paper!r} (one of {', '.join(PAPERS)})")
    if module is not None:
        importlib.import_module(module)
    return dict(_REGISTRY.get(paper, {}))


def add_module(paper: str, module: str) -> None:
    """A paper whose experiments live in `module` (tests register a tiny one this way)."""
    _MODULES[paper] = module


def sources(paper: str) -> list[str]:
    """The files a paper's results depend on (its benchmark script, the planner and progress modules of the
    schemes compared, the engine package): a results page is stale once any changed after its commit."""
    experiments(paper)
    if paper not in _MODULES:
        return []
    module = importlib.import_module(_MODULES[paper])
    return list(getattr(module, "SOURCES", []))
