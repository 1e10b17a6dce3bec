"""NetStorm (seed 002), simulated: scripts/bench/netstorm.py measures live only, so these experiments run
the simulator through `wansync.predict` (every scheme planned on the configured rates, simulated blind
with the data plane's measured costs) on internet2 draws (internet2:seed=SEED), with netstorm.py's
settings (AlexNet x scale, the hub star at node 5, its scheme list). Awareness and auxiliary paths act on
measured, changing rates: the simulator's oracle view has nothing for them to learn, so those rows are
declined in the manifest, not simulated."""

from __future__ import annotations

from typing import Any

from ..benches import bench
from ..registry import Experiment, register

SOURCES = ["scripts/bench/netstorm.py", "scheduler/planners/netstorm.py", "scheduler/planners/star.py",
           "scheduler/planners/mst.py", "scheduler/planners/ktree.py", "wansync/predict.py", "sim/"]
PAPER = "netstorm"
ALEXNET = 57_030_000  # parameters (netstorm.py: 57.03e6 x scale)
LADDER = ("star", "ktree", "mst", "netstorm-lite", "netstorm-std", "netstorm")


def _rounds(topology: str, schemes: list[str], scale: float, options: dict[str, Any] | None = None
            ) -> dict[str, float]:
    ns = bench("netstorm")
    from emulation.topology import build
    from wansync.predict import predict

    topo = build(topology).scaled(scale)
    preds = predict(topo, None, schemes, round(ALEXNET * scale), max(1024, round(1e6 * scale)),
                    {"hub": ns.HUB, **(options or {})})
    return {p.scheme: p.prediction.round_s for p in preds}


def ladder(cell: dict[str, Any], seed: int) -> dict[str, Any]:
    r = _rounds(f"internet2:seed={seed}", list(LADDER), cell["scale"])
    return {"valid": True, "live": False, **{f"{s.replace('-', '_')}_s": v for s, v in r.items()}}


register(Experiment(PAPER, "ladder", "Figs. 13/14/18 (static part): STAR -> BKT -> MST -> lite -> std -> pro, "
                    "simulated round on internet2 draws, AlexNet x scale", ladder, [{"scale": 0.05}], "scale",
                    ("star_over_netstorm+star_over_mst+star_over_ktree+star_over_netstorm_lite",),
                    quick_cells=[{"scale": 0.02}],
                    ratios=tuple((f"star_over_{s}", "star_s", f"{s}_s") for s in
                                 ("ktree", "mst", "netstorm_lite", "netstorm_std", "netstorm"))
                    + (("mst_over_netstorm", "mst_s", "netstorm_s"),),
                    table=("star_over_ktree", "star_over_mst", "star_over_netstorm_lite", "star_over_netstorm",
                           "mst_over_netstorm", "netstorm_s"),
                    shape="9.2x static over MXNet's PS; lite 5.5x, pro 7.5x; FAPT up to 6.7x STAR"))


def roots(cell: dict[str, Any], seed: int) -> dict[str, Any]:
    r = _rounds(f"internet2:seed={seed}", ["netstorm", "star"], 0.05, {"roots": cell["roots"]})
    return {"valid": True, "live": False, "netstorm_s": r["netstorm"], "star_s": r["star"]}


register(Experiment(PAPER, "roots", "Fig. 15: roots 1 -> 9 (static, simulated; the paper's is dynamic with "
                    "auxiliary paths)", roots, [{"roots": n} for n in range(1, 10)], "roots",
                    ("netstorm_s", "star_over_netstorm"), quick_cells=[{"roots": n} for n in (1, 9)],
                    ratios=(("star_over_netstorm", "star_s", "netstorm_s"),),
                    shape="throughput rises ~linearly with roots, peaks at 9 = |V|, 2.8x one root"))


def model_size(cell: dict[str, Any], seed: int) -> dict[str, Any]:
    r = _rounds(f"internet2:seed={seed}", ["star", "netstorm"], cell["scale"])
    return {"valid": True, "live": False, "star_s": r["star"], "netstorm_s": r["netstorm"]}


register(Experiment(PAPER, "model_size", "Fig. 19a: iteration time vs model size (AlexNet x scale, simulated)",
                    model_size, [{"scale": x} for x in (0.01, 0.02, 0.05, 0.1, 0.2)], "scale",
                    ("star_s+netstorm_s", "star_over_netstorm"), quick_cells=[{"scale": x} for x in (0.01, 0.05)],
                    ratios=(("star_over_netstorm", "star_s", "netstorm_s"),),
                    shape="both grow with size; NetStorm's slope much flatter"))


def cluster_size(cell: dict[str, Any], seed: int) -> dict[str, Any]:
    n = cell["nodes"]
    r = _rounds(f"waxman:{n}:seed={seed}", ["star", "netstorm"], 0.05, {"roots": n, "hub": 0})
    return {"valid": True, "live": False, "star_s": r["star"], "netstorm_s": r["netstorm"],
            "netstorm_throughput": n / r["netstorm"]}


register(Experiment(PAPER, "cluster_size", "Fig. 19b: 5 -> 15 sites (waxman:N draws, N roots, simulated)",
                    cluster_size, [{"nodes": n} for n in (5, 7, 9, 11, 13, 15)], "nodes",
                    ("netstorm_throughput", "star_over_netstorm"), quick_cells=[{"nodes": n} for n in (5, 9)],
                    ratios=(("star_over_netstorm", "star_s", "netstorm_s"),),
                    table=("netstorm_throughput", "netstorm_s", "star_over_netstorm"),
                    shape="normalised throughput grows linearly, scaling efficiency 0.93"))
