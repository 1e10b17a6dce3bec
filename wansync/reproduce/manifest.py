"""A paper's manifest (docs/results/PAPER/manifest.toml): every figure or table row of the paper we
reproduce (an experiment of the registry) or decline (with the reason), with the paper's value and the
setting each side was measured in."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATUSES = ("reproduced", "declined")
REQUIRED = ("id", "figure", "paper_value", "paper_setting", "our_setting", "status")


@dataclass(frozen=True)
class Row:
    id: str
    figure: str
    paper_value: str
    paper_setting: str
    our_setting: str
    status: str
    experiment: str = ""
    key: str = ""  # the figure of the experiment's summary quoted beside the paper's value
    cell: str = ""  # only the cells matching `k=v,k=v` (default: every cell)
    reason: str = ""

    def matches(self, cell: dict[str, Any]) -> bool:
        """Whether an experiment's cell is one this row quotes."""
        want = dict(kv.split("=", 1) for kv in self.cell.split(",") if kv)
        return all(str(cell.get(k)) == v for k, v in want.items())


class ManifestError(ValueError):
    pass


def load(path: Path) -> list[Row]:
    """The rows of a manifest, each checked: a status of the two, an experiment or a reason."""
    data: dict[str, Any] = tomllib.loads(path.read_text())
    rows = []
    for i, r in enumerate(data.get("row", [])):
        missing = [k for k in REQUIRED if not r.get(k)]
        if missing:
            raise ManifestError(f"{path}: row {i} lacks {', '.join(missing)}")
        row = Row(**{k: str(v) for k, v in r.items() if k in Row.__dataclass_fields__})
        if row.status not in STATUSES:
            raise ManifestError(f"{path}: row {row.id}: status {row.status!r} is not one of {STATUSES}")
        if row.status == "reproduced" and not row.experiment:
            raise ManifestError(f"{path}: row {row.id} is reproduced by no experiment")
        if row.status == "declined" and not row.reason:
            raise ManifestError(f"{path}: row {row.id} is declined without a reason")
        rows.append(row)
    ids = [r.id for r in rows]
    if len(set(ids)) != len(ids):
        raise ManifestError(f"{path}: row ids repeat")
    return rows
