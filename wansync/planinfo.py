"""A planner's own figures (Plan.info) as one readable line: tree packing's LP bound, trees and
solve time belong beside its round times in `wansync simulate` and `wansync run`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# key -> format; keys a planner does not report are skipped
FIELDS = (("sum_chi", "sum chi {:.1f} Mbit/s"), ("sum_chi_lp", "LP {:.1f}"),
          ("pruning_loss_pct", "{:.2f} % lost to pruning"), ("rounding_loss_pct", "{:.2f} % to rounding"),
          ("t_lp_s", "T_LP {:.3f} s"), ("lambda", "lambda {:.1f} Mbit/s"), ("s_over_lambda_s", "S/lambda {:.3f} s"),
          ("trees", "{} trees"), ("groups", "{} groups"), ("chunks", "{} chunks"), ("iterations", "{} iterations"),
          ("lp_gap_pct", "LP gap {:.3f} %"), ("solve_s", "solved in {:.3f} s"))


def info_line(scheme: str, info: Mapping[str, Any]) -> str | None:
    """`scheme: sum chi ..., T_LP ..., ...`, or None when the planner reported nothing."""
    parts = [fmt.format(info[k]) for k, fmt in FIELDS if info.get(k) is not None]
    fit = info.get("cpu_fit")
    if fit:  # scheduler/planners/cpufit.py: chunks cut coarser for the agents' machine
        parts.append(f"chunks cut {fit['chunks_before']} -> {fit['chunks']} for the agents' CPUs "
                     f"({'fits' if fit['fits'] else 'still over'}: {max(fit['need_cores']):.2f} of "
                     f"{min(fit['cores']):.2f} cores)")
    return f"{scheme}: " + ", ".join(parts) if parts else None
