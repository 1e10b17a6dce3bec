"""The exact sums every synchronization test compares results with, computed here, not by the product."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from core.plan import Plan


# --- exact sums, independent of agents.workload -------------------------------------------------------
def closed_form(rnd: int, node: int, params: int, attempt: int = 0) -> np.ndarray:
    """Node n's contribution in round r, attempt a, element i, written out again from its definition
    (agents/workload.py's docstring), in int64: ((7i + 13n + 31r + 17a + (i >> 5) n) mod 64) - 32."""
    i = np.arange(params, dtype=np.int64)
    return (7 * i + 13 * node + 31 * rnd + 17 * attempt + (i >> 5) * node) % 64 - 32


def exact_sum(rnd: int, nodes: Iterable[int], params: int, attempt: int = 0,
              weights: Mapping[int, float] | None = None, iters: Mapping[int, int] | None = None) -> np.ndarray:
    """The members' exact (weighted) sum as float32, summed in int64 where nothing rounds: weights must
    be integers (docs/tasks.md's rule for exact checks: integer weights, or divide once at the receivers).
    iters: member -> the iteration its contribution comes from (default `rnd`)."""
    total = np.zeros(params, dtype=np.int64)
    for n in nodes:
        w = 1.0 if weights is None else weights[n]
        assert w == int(w), f"node {n}: weight {w} is not an integer; no exact sum to compare with"
        total += int(w) * closed_form(rnd if iters is None else iters.get(n, rnd), n, params, attempt)
    assert np.abs(total).max(initial=0) < 2**24  # every value is an integer float32 holds exactly
    return total.astype(np.float32)


def digest_of(result: np.ndarray) -> str:
    """What agents report for a result: the hex XXH3-64 of its float32 bytes (the xxhash library's)."""
    return xxhash.xxh3_64_hexdigest(np.ascontiguousarray(result, dtype=np.float32).tobytes())


@lru_cache(maxsize=256)
def _exact_digest(rnd: int, nodes: tuple[int, ...], params: int, weights: tuple[tuple[int, float], ...] = (),
                  iters: tuple[tuple[int, int], ...] = ()) -> str:
    return digest_of(exact_sum(rnd, nodes, params, weights=dict(weights) if weights else None,
                               iters=dict(iters) if iters else None))


def assert_round_exact(rec: Any, plan: Plan) -> None:
    """Every receiver of a task record (scheduler.tasks.TaskRecord, or its JSON form) holds the exact
    (weighted) sum of the members of the plan version it ran, as this module computes it: not only as
    the agents' own check (`ok`) and their agreement (`digests_agree`) say."""
    r = rec if isinstance(rec, Mapping) else rec.__dict__
    where = f"job {r['job']} task {r['task']} round {r['round']} attempt {r['attempt']} (plan v{r['version']})"
    assert plan.version == r["version"], f"{where}: judged against plan v{plan.version}"
    want = _exact_digest(r["round"], tuple(sorted(plan.participants)), plan.params,
                         tuple(sorted(plan.weights.items())) if any(w != 1.0 for w in plan.weights.values()) else (),
                         tuple(sorted((int(n), int(k)) for n, k in r.get("iters", {}).items())))
    digests = {int(n): d for n, d in r["digests"].items()}
    receivers = sorted(set(plan.receiver_set) - {int(n) for n in r.get("dropped", ())})
    assert sorted(digests) == receivers, f"{where}: digests from nodes {sorted(digests)}, receivers {receivers}"
    wrong = sorted(n for n, d in digests.items() if d != want)
    assert not wrong, f"{where}: nodes {wrong} hold a result that is not the exact sum"


def assert_records_exact(records: Iterable[Any], plans: Mapping[int, Plan]) -> int:
    """assert_round_exact for every record, with the plan of its version; how many were judged."""
    n = 0
    for rec in records:
        version = rec["version"] if isinstance(rec, Mapping) else rec.version
        assert version in plans, f"round record of plan v{version}, which was never published"
        assert_round_exact(rec, plans[version])
        n += 1
    return n


def assert_job_exact(sched: Any, js: Any) -> None:
    """Every round record of a job (scheduler.service.JobState), judged with the scheduler's plans."""
    assert js.records, f"job {js.job} recorded no round"
    assert_records_exact(js.records, sched.plans)


def assert_results_exact(path: Path | str) -> int:
    """Every round record in a `wansync run --out` file, judged with the plans the same file holds;
    how many rounds were judged."""
    recs = [json.loads(line) for line in Path(path).read_text().splitlines()]
    plans = {r["version"]: Plan.from_wire(r["plan"]) for r in recs if r["type"] == "plan"}
    n = assert_records_exact([r for r in recs if r["type"] == "task"], plans)
    assert n > 0, f"{path} holds no round record"
    return n


def assert_float_sum(got: np.ndarray, contributions: Iterable[np.ndarray]) -> None:
    """A float32 sum of m contributions against the float64 reference this computes: the worst
    element's error, relative to the sum of magnitudes there, within (m + 1) 2^-24 (any order)."""
    xs = [np.asarray(x, np.float64) for x in contributions]
    ref, scale = sum(xs), sum(np.abs(x) for x in xs)
    err = float(np.max(np.abs(np.asarray(got, np.float64) - ref) / scale))
    assert err <= (len(xs) + 1) * 2.0 ** -24, f"{err:.3g} off the float64 sum, bound {(len(xs) + 1) * 2.0 ** -24:.3g}"
