"""README figures that come from results files: each is followed by a marker naming the file's figure,

    1.64 <!-- result selmcast/bsp_vs_n?n=100&mode=l3 orph_over_sel.median -->

(paper/experiment, the cell's settings as a query, the figure and which statistic: median, lo or hi), so
a check can read the committed summary and say whether the number typed beside it still matches at the
precision it is written with."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

MARK = re.compile(r"(?<![\d.])(?P<shown>-?\d+(?:\.\d+)?)\s*(?:x|×|%)?\s*<!-- result (?P<ref>\S+) (?P<key>\S+) -->")


@dataclass(frozen=True)
class Mark:
    shown: str
    paper: str
    experiment: str
    cell: dict[str, str]
    figure: str
    stat: str
    actual: float | None

    @property
    def ok(self) -> bool:
        """The committed value, rounded as the README writes it, is the README's number."""
        if self.actual is None:
            return False
        decimals = len(self.shown.partition(".")[2])
        return abs(self.actual - float(self.shown)) <= 0.5 * 10 ** -decimals + 1e-9


def lookup(summary: dict[str, Any], experiment: str, cell: dict[str, str], figure: str, stat: str) -> float | None:
    exp = summary.get("experiments", {}).get(experiment)
    if exp is None:
        return None
    for c in exp["cells"]:
        if all(str(c["cell"].get(k)) == v for k, v in cell.items()) and figure in c["figures"]:
            v = c["figures"][figure].get(stat)
            return float(v) if isinstance(v, int | float) else None
    return None


def marks(readme: str, results: Path) -> list[Mark]:
    """Every marked figure of `readme`, with the value its results file holds now (None: not found)."""
    out, cache = [], {}
    for m in MARK.finditer(readme):
        ref, key = m["ref"], m["key"]
        path, _, query = ref.partition("?")
        paper, _, experiment = path.partition("/")
        figure, _, stat = key.rpartition(".")
        if paper not in cache:
            f = results / paper / "summary.json"
            cache[paper] = json.loads(f.read_text()) if f.exists() else {}
        cell = dict(parse_qsl(query))
        out.append(Mark(m["shown"], paper, experiment, cell, figure, stat,
                        lookup(cache[paper], experiment, cell, figure, stat or "median")))
    return out
