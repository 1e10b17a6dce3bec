"""One PNG per experiment, shaped like the paper's figure: the swept setting on x, the median across seeds
on y with the order-statistic interval as error bars, a line per series (scheme, mode, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .registry import Experiment


def _x_positions(values: list[Any]) -> tuple[list[float], list[str] | None]:
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return [float(v) for v in values], None
    labels = list(dict.fromkeys(str(v) for v in values))
    return [float(labels.index(str(v))) for v in values], labels


def draw(exp: Experiment, summary: dict[str, Any], path: Path) -> Path | None:
    """Write the figure; None when the summary has no cell to draw."""
    cells = summary["cells"]
    if not cells:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [[k for k in p.split("+") if any(k in c["figures"] for c in cells)] for p in exp.plot]
    panels = [p for p in panels if p]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.5), squeeze=False)
    for ax, keys in zip(axes[0], panels, strict=True):
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for key in keys:
            for c in cells:
                label = ", ".join([*([key] if len(keys) > 1 else []), *(f"{s}={c['cell'].get(s)}"
                                                                        for s in exp.series)]) or key
                groups.setdefault((label, key), []).append(c)
        all_x = [c["cell"].get(exp.x) for c in cells]
        _, labels = _x_positions(all_x)
        for (label, key), cs in groups.items():
            pts = sorted(((c["cell"].get(exp.x), c["figures"][key]) for c in cs if key in c["figures"]),
                         key=lambda p: (labels.index(str(p[0])) if labels else p[0]))
            if not pts:
                continue
            xs = [labels.index(str(p[0])) if labels else float(p[0]) for p in pts]
            med = [p[1]["median"] for p in pts]
            err = [[m - p[1]["lo"] for m, p in zip(med, pts, strict=True)],
                   [p[1]["hi"] - m for m, p in zip(med, pts, strict=True)]]
            ax.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=label)
        if labels:
            ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel(exp.x)
        ax.set_ylabel(" / ".join(keys) if len(keys) < 3 else keys[0].split("_", 1)[-1])
        ax.grid(alpha=0.3)
        if exp.series or len(keys) > 1:
            ax.legend(fontsize=7)
    n = max((f["n"] for c in cells for f in c["figures"].values()), default=0)
    fig.suptitle(f"{exp.paper}: {exp.title}\nmedian, error bars: order-statistic interval ({n} seeds)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
