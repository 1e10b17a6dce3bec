"""`wansync train` under the partial and multicast progress models (docs/training-progress.md), end to
end: real agent processes, real torch scripts, real TCP. Each script records what it sent and what came
back at every sync (tests/helpers/recorded_train.py); the references are computed here from that.

- queue, selective, crew: model mode's result is the float64 weighted sum of the group's members'
  models within float32's rounding bound, |r - ref| <= (m + 1) 2^-24 sum_j |w_j x_j| elementwise;
- mcast-bsp, mcast-ssp: every combination is the rank's own model plus the models it applied, and none
  of those is older than the staleness bound allows (the rule replayed from the recorded steps);
- the pairs that make no sense are refused, saying why.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.loopback, pytest.mark.torch, pytest.mark.timeout(600)]
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "helpers" / "recorded_train.py"
EXAMPLE = ROOT / "examples" / "train_digits.py"
U = 2.0 ** -24
NODES, STEPS = 4, 8


def wansync(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wansync.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})


def train(tmp: Path, progress: str, scheme: str, topology: str, *extra: str, pace: float = 0.01
          ) -> tuple[dict[int, list[dict]], list[dict]]:
    """Run the recording script; every rank's records and the results file's records."""
    out = tmp / "results.jsonl"
    p = wansync("train", str(SCRIPT), "--nodes", str(NODES), "--topology", topology, "--schemes", scheme,
                "--progress", progress, *extra, "--run-timeout", "240", "--no-http", "--out", str(out), "--", str(tmp),
                str(STEPS), str(pace))
    assert p.returncode == 0, p.stderr[-4000:]
    ranks = {r: pickle.loads((tmp / f"rank-{r}.pkl").read_bytes()) for r in range(NODES)}
    return ranks, [json.loads(line) for line in out.read_text().splitlines()]


def within_bound(result: np.ndarray, terms: list[np.ndarray]) -> tuple[bool, float]:
    """Is `result` the sum of `terms` (each w_j x_j, float64) within (m + 1) u sum |terms|, elementwise?"""
    ref = np.sum(terms, axis=0)
    scale = np.sum(np.abs(terms), axis=0)
    err = np.abs(result.astype(np.float64) - ref)
    ok = err <= (len(terms) + 1) * U * scale
    worst = float(np.max(np.where(scale > 0, err / np.where(scale > 0, scale, 1), 0)))
    return bool(ok.all()), worst


@pytest.mark.parametrize("progress,scheme,topology,extra", [
    ("queue", "ring", "uniform:200", ("--group", "3", "--compute-model", "lognormal:mean=0.05,cv=0.6,spread=0.5")),
    ("selective", "ring", "switch:4:unit=25", ("--group", "2")),
    ("crew", "crew", "crew:4:x=0.1", ("--group", "3")),  # 32 syncs: the last ones go short
])
def test_model_mode_partial_reduce_is_the_weighted_sum_of_the_members_models(tmp_path, progress, scheme, topology,
                                                                             extra):
    ranks, results = train(tmp_path, progress, scheme, topology, *extra)
    # every task's result, as each member got it: the same bytes for every member of one task
    by_result: dict[bytes, dict[int, dict]] = {}
    for rank, recs in ranks.items():
        assert len(recs) == 1 + STEPS  # the attach broadcast, then one sync per step
        for rec in recs:
            by_result.setdefault(rec["result"].tobytes(), {})[rank] = rec
    partial = 0
    for got in by_result.values():
        rec = next(iter(got.values()))
        members, weights = rec["members"], rec["weights"]
        assert sorted(got) == members, f"every member holds the task's result: {sorted(got)} vs {members}"
        assert len(weights) == len(members) and rec["weight"] == pytest.approx(sum(weights))
        terms = [np.float64(w) * got[m]["sent"].astype(np.float64) for m, w in zip(members, weights, strict=True)]
        ok, worst = within_bound(rec["result"], terms)
        assert ok, f"members {members}: error {worst:.3g} of sum |w x| beyond ({len(members)} + 1) 2^-24"
        partial += len(members) < NODES
    assert partial >= 2, "the progress model formed partial groups"
    if progress == "selective":  # the controller's staleness weights: not a plain sum
        assert any(len(set(g[next(iter(g))]["weights"])) > 1 for g in by_result.values())
    run = next(r for r in results if r.get("type") == "train_run")
    assert run["syncs_wrong"] == 0
    stats = [r["training"] for r in results if r.get("type") == "node_stats"]
    # no barrier: a rank may still read a result while the next group sums, so none lands in its region
    assert all(s["deliver_s"] > 0 for s in stats if s["steps"])
    if "--compute-model" in extra:  # the scripts' own step times, padded up to the compute model's draws
        assert any(s["padded_s"] > 0 for s in stats)


def replay(results: list[dict], ranks: dict[int, list[dict]], s: int) -> int:
    """Check every rank's combinations against the staleness rule and against what the senders sent;
    returns how many received models were applied."""
    stats = {r["node"]: r["training"] for r in results if r.get("type") == "node_stats"}
    applied = 0
    for i, st in stats.items():
        rec = st["received"]
        assert rec["staleness"] == s
        assert rec["combined"] == list(range(STEPS)), "a combination after every step"
        log = rec["applied"]
        per_k: dict[int, dict[int, int]] = {}
        for k, j, t in zip(log[0::3], log[1::3], log[2::3], strict=True):
            assert k - t <= s, f"rank {i} applied rank {j}'s model of iteration {t} after its own {k} (bound {s})"
            per_k.setdefault(k, {})[j] = t
        for k in range(STEPS):
            got = ranks[i][1 + k]  # record 0 is the attach broadcast
            senders = per_k.get(k, {})
            assert got["members"] == sorted([i, *senders]) and got["weight"] == 1 + len(senders)
            terms = [got["sent"].astype(np.float64)] + [ranks[j][1 + t]["sent"].astype(np.float64)
                                                        for j, t in senders.items()]
            ok, worst = within_bound(got["result"], terms)
            assert ok, f"rank {i} step {k}: not its model plus {senders} (error {worst:.3g})"
            applied += len(senders)
    return applied


def test_mcast_ssp_workers_apply_received_models_within_the_staleness_bound(tmp_path):
    ranks, results = train(tmp_path, "mcast-ssp", "mcast", "uniform:200", "--staleness", "1", pace=0.02)
    assert replay(results, ranks, s=1) > 0


def test_mcast_bsp_workers_apply_the_round_they_finished(tmp_path):
    ranks, results = train(tmp_path, "mcast-bsp", "mcast", "uniform:200")
    assert replay(results, ranks, s=0) > 0  # s = 0: every model applied is of the very round (k == t)


@pytest.mark.parametrize("mode,progress,scheme,reason", [
    ("grad", "queue", "ring", "a partial group gives its members one average"),
    ("outer", "crew", "crew", "changing group"),
    ("grad", "mcast-ssp", "mcast", "multicast model delivers some ranks' models"),
])
def test_pairs_that_make_no_sense_are_refused_saying_why(mode, progress, scheme, reason):
    p = wansync("train", str(EXAMPLE), "--nodes", "3", "--topology", "uniform:200", "--schemes", scheme,
                "--progress", progress, "--no-http", "--", "--steps", "4", "--hidden", "8", "--mode", mode)
    assert p.returncode == 1, p.stderr[-3000:]
    assert f"mode {mode!r} under --progress {progress}" in p.stderr and reason in p.stderr, p.stderr[-3000:]
    assert "Traceback" not in p.stderr.splitlines()[-1]
