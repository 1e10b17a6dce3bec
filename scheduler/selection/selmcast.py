"""SelMcast's receiver selection (seed 000, digest §2.2-2.3): Algorithm 1 for BSP, Algorithm 2 for SSP.

The network is the paper's non-blocking big switch: congestion only at each worker's ingress port
(its uplink, b^I) and egress port (its downlink, b^E). A multicast of volume v from i loads i's
uplink with s_i = max_j v_ij x_ij (L3: every byte injected once, replicated by the network) or
sum_j v_ij x_ij (L7: one unicast per receiver), eq. (9), and every receiver's downlink with v_ij.
The fluid completion estimate is t = max over ports of load / bandwidth (the MILP's objective, 12).

Algorithm 1 (BSP, once per round at the barrier):
  basic   the forced pairs D first; then senders in order of most forced receivers first, each
          taking the q = p_i - |forced| receivers whose downlinks would finish soonest with it,
          (v_i + R_j) / b^E_j (weighted load balancing over downlinks: eq. 13 drops the ingress)
  Pareto  t = the basic selection's estimated completion; every other pair, most-missed (c) first,
          is admitted if neither its sender's uplink nor its receiver's downlink would then exceed t
Algorithm 2 (SSP, online on every READY of a worker kappa): kappa's new task starts with every other
worker as candidate; for every task in flight (G), keep the forced pairs and the "sticky" receivers
(already past 1 - eta of the volume), top each task up to p_i from its current receivers on the
least-loaded downlinks (tasks in order of tau_i, the time they will be blocked by the SSP bound
anyway), then per task a deadline t_i = max(tau_i, its ports' estimate) and Pareto extras within
it. Receiver sets only shrink: whoever is not kept is dropped (its partial data wasted).

Ties are broken by a seeded shuffle and a stable sort (digest §2.2: c is all zero in round 1, and
sorting by index would hand every extra receiver to the low-index senders). Volumes and bandwidths
need only consistent units (bytes and bytes/s give seconds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MODES = ("l3", "l7")
_TOL = 1e-9  # relative slack of the "t is not raised" tests (float sums of equal volumes)


@dataclass(frozen=True)
class Selection:
    """Algorithm 1's answer for one BSP round."""

    x: np.ndarray  # bool n x n: x[i, j] = worker j receives i's multicast
    t: float  # estimated completion of the whole selection (fluid: every port drains at its bandwidth)
    t_basic: float  # ... of the basic selection alone (Pareto extras never raise it)
    basic: np.ndarray  # bool n x n: the basic selection (forced pairs and the p_i per sender)

    @property
    def scale(self) -> float:
        """Receivers per multicast, over n (the paper's normalised multicast scale)."""
        n = len(self.x)
        return float(self.x.sum()) / n / n


@dataclass(frozen=True)
class SspChoice:
    """Algorithm 2's answer on one READY."""

    y: np.ndarray  # bool n x n: every task's receivers from now on (rows of tasks not in flight: 0)
    deadline: np.ndarray  # per task in flight: t_i, seconds from now (inf elsewhere): EDF's key
    dropped: list[tuple[int, int]]  # (task, receiver) pairs leaving a task (never re-added in it)
    order: list[int]  # L: the tasks in the order they chose (ties of EDF go this way)


def ingress_load(x: np.ndarray, V: np.ndarray, mode: str) -> np.ndarray:
    """s_i of eq. (9): what each sender's uplink must carry for receiver sets x."""
    sel = np.where(x, V, 0.0)
    return sel.max(axis=1, initial=0.0) if mode == "l3" else sel.sum(axis=1)


def completion(x: np.ndarray, V: np.ndarray, b_in: np.ndarray, b_out: np.ndarray, mode: str) -> float:
    """The fluid completion estimate t = max over ports of load / bandwidth (the MILP's objective)."""
    s = ingress_load(x, V, mode)
    r = np.where(x, V, 0.0).sum(axis=0)
    return float(max((s / b_in).max(initial=0.0), (r / b_out).max(initial=0.0)))


def instance(volume: np.ndarray, b_in: np.ndarray, b_out: np.ndarray, p: int | Sequence[int] | np.ndarray,
             mode: str, forced: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A BSP selection's inputs checked (a clear error naming the bad one): v, b_in, b_out, the
    minimum receivers per sender, D."""
    n = len(volume)
    if mode not in MODES:
        raise ValueError(f"mode: must be l3 or l7, got {mode!r}")
    return (_check(n, "volume", volume), _check(n, "b_in", b_in, positive=True),
            _check(n, "b_out", b_out, positive=True), _mins(n, p), _matrix(n, "forced", forced, bool))


def _check(n: int, name: str, a: np.ndarray, *, positive: bool = False) -> np.ndarray:
    a = np.asarray(a, dtype=float)
    if a.shape != (n,):
        raise ValueError(f"{name}: expected {n} values, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0) or (positive and np.any(a <= 0)):
        raise ValueError(f"{name}: every value must be finite and {'> 0' if positive else '>= 0'}")
    return a


def _mins(n: int, p: int | Sequence[int] | np.ndarray) -> np.ndarray:
    q = np.full(n, p, dtype=np.int64) if np.ndim(p) == 0 else np.asarray(p, dtype=np.int64)
    if q.shape != (n,) or np.any(q < 0):
        raise ValueError(f"p: the minimum receivers per sender must be {n} integers >= 0 (or one)")
    return np.minimum(q, n - 1)


def _matrix(n: int, name: str, a: np.ndarray | None, dtype: type) -> np.ndarray:
    if a is None:
        return np.zeros((n, n), dtype=dtype)
    a = np.asarray(a, dtype=dtype)
    if a.shape != (n, n):
        raise ValueError(f"{name}: expected an {n} x {n} matrix, got shape {a.shape}")
    return a


def _order(keys: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices sorted by `keys` ascending, ties in a seeded random order (shuffle, then stable sort)."""
    perm = rng.permutation(len(keys))
    return perm[np.argsort(keys[perm], kind="stable")]


def selmcast_bsp(volume: np.ndarray, b_in: np.ndarray, b_out: np.ndarray, p: int | Sequence[int], *,
                 mode: str = "l3", forced: np.ndarray | None = None, misses: np.ndarray | None = None,
                 rng: np.random.Generator | None = None, pareto: bool = True) -> Selection:
    """Algorithm 1. volume: v_i per sender; b_in/b_out: uplink/downlink bandwidth per worker; p: the
    minimum receivers per sender; forced: D (bool n x n); misses: c, which orders the Pareto pass."""
    n = len(volume)
    v, b_in, b_out, mins, d = instance(volume, b_in, b_out, p, mode, forced)
    d = d.copy()
    np.fill_diagonal(d, False)
    c = _matrix(n, "misses", misses, np.int64)
    rng = rng if rng is not None else np.random.default_rng(0)
    x = d.copy()
    R = (v[:, None] * x).sum(axis=0)
    for i in _order(-x.sum(axis=1), rng):  # most forced receivers first
        q = int(mins[i] - x[i].sum())
        if q <= 0:
            continue
        cand = np.flatnonzero(~x[i])
        cand = cand[cand != i]
        pick = cand[_order((v[i] + R[cand]) / b_out[cand], rng)[:q]]
        x[i, pick] = True
        R[pick] += v[i]
    V = np.broadcast_to(v[:, None], (n, n))
    basic = x.copy()
    t = completion(x, V, b_in, b_out, mode)
    if pareto:
        _pareto_bsp(x, v, b_in, b_out, R, c, t, mode, rng)
    return Selection(x, completion(x, V, b_in, b_out, mode), t, basic)


def _pareto_bsp(x: np.ndarray, v: np.ndarray, b_in: np.ndarray, b_out: np.ndarray, R: np.ndarray, c: np.ndarray,
                t: float, mode: str, rng: np.random.Generator) -> None:
    """Admit pairs, most-missed first, while no port's load / bandwidth exceeds t (t stays fixed)."""
    n = len(v)
    free = ~x
    np.fill_diagonal(free, False)
    ii, jj = np.nonzero(free)
    order = _order(-c[ii, jj], rng)
    s = ingress_load(x, np.broadcast_to(v[:, None], (n, n)), mode).tolist()
    lim_in, lim_out = (t * b_in * (1 + _TOL)).tolist(), (t * b_out * (1 + _TOL)).tolist()
    r, vl = R.tolist(), v.tolist()
    l3 = mode == "l3"
    for i, j in zip(ii[order].tolist(), jj[order].tolist(), strict=True):
        vi = vl[i]
        s_new = max(s[i], vi) if l3 else s[i] + vi
        r_new = r[j] + vi
        if s_new <= lim_in[i] and r_new <= lim_out[j]:
            x[i, j] = True
            s[i], r[j] = s_new, r_new


def selmcast_ssp(kappa: int, active: np.ndarray, x: np.ndarray, V: np.ndarray, volume: np.ndarray,
                 b_in: np.ndarray, b_out: np.ndarray, p: int | Sequence[int], tau: np.ndarray, *,
                 mode: str = "l3", eta: float = 0.75, forced: np.ndarray | None = None,
                 misses: np.ndarray | None = None, rng: np.random.Generator | None = None,
                 tau_order: str = "increasing") -> SspChoice:
    """Algorithm 2, on worker `kappa` becoming ready. active: tasks in flight (G, without kappa's new
    one); x: their current receivers; V: what each (task, receiver) still has to deliver; volume: v_i
    (kappa's new task delivers all of it to every candidate); tau: per task, how long its sender
    will be blocked by the SSP bound anyway (seconds). tau_order: the pseudocode's non-decreasing
    tau ("increasing", our default: the least slack chooses first) or the prose's ("decreasing")."""
    n = len(volume)
    if mode not in MODES:
        raise ValueError(f"mode: must be l3 or l7, got {mode!r}")
    if not 0 <= kappa < n:
        raise ValueError(f"kappa: worker {kappa} outside 0..{n - 1}")
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta: must be in [0, 1], got {eta}")
    if tau_order not in ("increasing", "decreasing"):
        raise ValueError(f"tau_order: increasing or decreasing, got {tau_order!r}")
    v = _check(n, "volume", volume)
    b_in, b_out = _check(n, "b_in", b_in, positive=True), _check(n, "b_out", b_out, positive=True)
    tau = _check(n, "tau", tau)
    mins = _mins(n, p)
    G = np.asarray(active, dtype=bool).copy()
    x = _matrix(n, "x", x, bool).copy()
    V = _matrix(n, "V", V, float).copy()
    x[~G] = False
    np.fill_diagonal(x, False)
    d = _matrix(n, "forced", forced, bool)
    c = _matrix(n, "misses", misses, np.int64)
    rng = rng if rng is not None else np.random.default_rng(0)
    # initialisation: kappa's task, every other worker a candidate with everything still to deliver
    G[kappa] = True
    x[kappa] = True
    x[kappa, kappa] = False
    V[kappa] = v[kappa]
    V = np.where(x, np.maximum(V, 0.0), 0.0)
    # basic selection: forced pairs and receivers past 1 - eta of the volume stay (and those already
    # complete, which the eta test cannot pin at eta = 0); then each task up to p_i, lightest first
    y = x & (d | (V < eta * v[:, None]) | (V <= 0.0))
    tasks = np.flatnonzero(G)
    keys = tau[tasks] if tau_order == "increasing" else -tau[tasks]
    L = tasks[_order(keys, rng)].tolist()
    R = (V * y).sum(axis=0)
    for i in L:
        q = int(mins[i] - y[i].sum())
        if q <= 0:
            continue
        cand = np.flatnonzero(x[i] & ~y[i])
        pick = cand[_order((V[i, cand] + R[cand]) / b_out[cand], rng)[:q]]
        y[i, pick] = True
        R[pick] += V[i, pick]
    # per-task deadlines under the basic plan, then Pareto extras within each task's own deadline
    s = ingress_load(y, V, mode)
    deadline = np.full(n, np.inf)
    for i in L:
        ports = R[y[i]] / b_out[y[i]]
        deadline[i] = max(tau[i], s[i] / b_in[i], ports.max(initial=0.0))
    free = x & ~y
    ii, jj = np.nonzero(free)
    order = _order(-c[ii, jj], rng)
    sl, rl, dl = s.tolist(), R.tolist(), deadline.tolist()
    bi, bo = b_in.tolist(), b_out.tolist()
    l3 = mode == "l3"
    for i, j in zip(ii[order].tolist(), jj[order].tolist(), strict=True):
        vij = float(V[i, j])
        s_new = max(sl[i], vij) if l3 else sl[i] + vij
        r_new = rl[j] + vij
        lim = dl[i] * (1 + _TOL)
        if s_new <= lim * bi[i] and r_new <= lim * bo[j]:
            y[i, j] = True
            sl[i], rl[j] = s_new, r_new
    dropped = [(int(i), int(j)) for i, j in zip(*np.nonzero(x & ~y), strict=True)]
    return SspChoice(y, deadline, dropped, L)
