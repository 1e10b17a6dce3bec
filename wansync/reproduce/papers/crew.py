"""CREW (seed 004): scripts/bench/crew.py's simulated cases at n = 60 (`sim_case`, `scatter_case`,
`outage_case`, `one_task_times`), per cell and seed; the workloads are its stand-ins (N1: a lognormal
surrogate of EC2's inter-region rates, N2: the paper's generator; T1/T2: lognormal surrogates of the
paper's compute traces, which are not available)."""

from __future__ import annotations

from typing import Any

from ..benches import bench
from ..registry import Experiment, register

SOURCES = ["scripts/bench/crew.py", "scheduler/planners/crew.py", "scheduler/planners/crew_split.py",
           "scheduler/planners/a2a.py", "scheduler/progress/crew.py", "sim/"]
PAPER = "crew"


def rounds(schemes: tuple[str, ...]) -> Any:
    def run(cell: dict[str, Any], seed: int) -> dict[str, Any]:
        c = bench("crew")
        out: dict[str, Any] = {"valid": True, "live": False}
        extra = {k: cell[k] for k in ("noise", "model_x") if k in cell}
        for s in cell.get("schemes", ",".join(schemes)).split(","):
            r = c.sim_case((s, cell["p"], seed, cell.get("net", "N2"), cell.get("compute", "T1"), dict(extra)))
            key = s.replace("-", "_")
            out[f"{key}_rounds"], out[f"{key}_tasks"] = r["rounds"], r["tasks"]
        return out
    return run


WORKLOADS = [("N1", "T1"), ("N1", "T2"), ("N2", "T1"), ("N2", "T2")]
RATIOS = (("crew_over_opr", "crew_rounds", "opr_rounds"), ("crew_over_a2a", "crew_rounds", "a2a_rounds"),
          ("variant_gain", "crew_rounds", "crew_ed_fs_rounds"))
register(Experiment(PAPER, "fig5_rounds", "Fig. 5: rounds per worker in 50 s (n = 60, 180 MB), crew vs OPR vs A2A and "
                    "(N-A, FCFS) over (E-D, FS), four workload stand-ins", rounds(("crew", "crew-ed-fs", "opr", "a2a")),
                    [{"p": p, "net": n, "compute": c} for p in (5, 10) for n, c in WORKLOADS], "p",
                    ("crew_rounds+opr_rounds+a2a_rounds", "crew_over_opr", "crew_over_a2a"),
                    quick_cells=[{"p": 5, "net": "N2", "compute": "T1"}], ratios=RATIOS, series=("net", "compute"),
                    table=("crew_over_opr", "crew_over_a2a", "variant_gain", "crew_rounds", "opr_rounds", "a2a_rounds"),
                    shape="p = 5: 12-15x vs A2A, 8-9x vs OPR; p = 10: 4-5x vs OPR; N-A + FCFS 1.5-2x E-D + FS"))

SCHEDS = ("fl", "fs", "tl", "c1", "c2")
register(Experiment(PAPER, "fig7_sched", "Fig. 7: rounds in 50 s by flow scheduling (N-A; N2, T1)",
                    rounds(()), [{"p": p, "schemes": ",".join(f"crew-na-{s}" for s in SCHEDS)} for p in (4, 5, 10, 12)],
                    "p", ("+".join(f"crew_na_{s}_rounds" for s in SCHEDS),),
                    quick_cells=[{"p": 5, "schemes": ",".join(f"crew-na-{s}" for s in SCHEDS)}],
                    ratios=tuple((f"{s}_over_fl", f"crew_na_{s}_rounds", "crew_na_fl_rounds") for s in SCHEDS[1:]),
                    table=(*(f"crew_na_{s}_rounds" for s in SCHEDS), "c1_over_fl"),
                    shape="FL best; C1 worst, about TL; C2 hurts less; FS below FL; rounds fall as p grows"))
register(Experiment(PAPER, "fig10_model", "Fig. 10: rounds in 50 s as the model grows x2, x4, x8 (crew, p = 5, N2, "
                    "T1; the paper runs 100 s)", rounds(("crew",)),
                    [{"p": 5, "model_x": x} for x in (1, 2, 4, 8)], "model_x", ("crew_rounds",),
                    quick_cells=[{"p": 5, "model_x": 2}], shape="rounds fall sub-linearly in model size"))
register(Experiment(PAPER, "fig11_noise", "Fig. 11: rounds in 50 s deciding on rates x (1 + U[-l, l]) (N2, T2, p = 5)",
                    rounds(("crew", "crew-ed-fl")), [{"p": 5, "net": "N2", "compute": "T2", "noise": x}
                                                     for x in (0.0, 0.1, 0.3, 0.5)], "noise",
                    ("crew_rounds+crew_ed_fl_rounds",), quick_cells=[{"p": 5, "net": "N2", "compute": "T2",
                                                                      "noise": 0.5}],
                    ratios=(("na_over_ed", "crew_rounds", "crew_ed_fl_rounds"),),
                    shape="N-A degrades slowly with noise; E-D is unaffected"))


def scatter(cell: dict[str, Any], seed: int) -> dict[str, Any]:
    c = bench("crew")
    b = c.scatter_case((cell["p"], seed, False))["rounds"]
    nb = c.scatter_case((cell["p"], seed, True))["rounds"]
    return {"valid": True, "live": False, "blocking_rounds": b, "nonblocking_rounds": nb}


register(Experiment(PAPER, "fig6_scatter", "Fig. 6: blocking vs non-blocking scatter (crew; N2, T1)", scatter,
                    [{"p": p} for p in (4, 5, 10, 12)], "p", ("blocking_rounds+nonblocking_rounds", "gain"),
                    quick_cells=[{"p": 5}], ratios=(("gain", "nonblocking_rounds", "blocking_rounds"),),
                    shape="non-blocking never worse, up to 1.2x"))


def outage(cell: dict[str, Any], seed: int) -> dict[str, Any]:
    r = bench("crew").outage_case((cell["p"], seed, cell["failed_links"]))
    return {"valid": True, "live": False, "rounds": r["rounds"], "repaired": r["repaired"], "abandoned": r["abandoned"]}


register(Experiment(PAPER, "fig8_outage", "Fig. 8: rounds in 50 s as links fail for good (crew, Eq. (3) repair)",
                    outage, [{"p": p, "failed_links": f} for p in (5, 10) for f in (0, 1, 2, 4, 8, 16)],
                    "failed_links", ("rounds",), quick_cells=[{"p": 5, "failed_links": f} for f in (0, 4)],
                    series=("p",), table=("rounds", "repaired", "abandoned"),
                    shape="a sharp drop once faults start, then nearly flat; larger p more sensitive"))

TASK_SCHEMES = ("crew", "opr", "ps", "gring", "toa", "a2a", "blink")


def one_task(cell: dict[str, Any], seed: int) -> dict[str, Any]:
    c = bench("crew")
    from scheduler import planners

    schemes = [s for s in TASK_SCHEMES if s in planners.SCHEMES]
    got = c.one_task_times(cell["net"], seed, schemes)
    out: dict[str, Any] = {"valid": True, "live": False}
    for s, (task_s, ms) in got.items():
        out[f"{s}_task_s"], out[f"{s}_plan_ms"] = task_s, ms
    return out


register(Experiment(PAPER, "fig4_task", "Fig. 4: one partial reduce (n = 60, p = 5, 180 MB): completion s per scheme",
                    one_task, [{"net": n} for n in ("N1", "N2")], "net",
                    ("crew_task_s+opr_task_s+a2a_task_s+ps_task_s", "ps_over_crew"), quick_cells=[{"net": "N2"}],
                    ratios=tuple((f"{s}_over_crew", f"{s}_task_s", "crew_task_s") for s in TASK_SCHEMES[1:]),
                    table=("crew_task_s", "opr_over_crew", "ps_over_crew", "gring_over_crew", "toa_over_crew",
                           "a2a_over_crew", "blink_over_crew"),
                    shape="CREW < OPR << PS, Ring, ToA, BLINK, A2A (up to tens of times)"))
