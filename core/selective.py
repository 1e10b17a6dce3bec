"""Selective reduce's controller (seed 003, digest §2.5-2.7, §5): which ready workers synchronize
together, and when. One state machine for every scheme the issue compares, so the live scheduler
(scheduler/progress/selective.py) and the simulator's job mode (sim/job.py) run the same decisions:

    sr   Selective Reduce: BAG groups the ready queue by bandwidth, bpaWR waits (up to dt at a time)
         when faster workers predicted by the runtime CDF would replace a group's bottleneck
    pr   P-Reduce: the first p ready workers (arrival order), at once; no waiting, no bandwidth
    ar   all-reduce (BSP): every worker, once all are ready
    pa   progress-aware only (ablation, Fig. 3's third case): the whole queue as one group, held
         while the CDF expects at least one more arrival within dt

Events in, launches out: `ready` (a worker finished its round), `done` (a group's sync ended; each
member resumed training at its own time), `aborted`, `lost`, and `tick` at `wake_at` (set while a
group waits on bpaWR's advice). Every c-th sync is a full all-reduce of all active workers (A7: the
counter counts full syncs too). A pass is recomputed from scratch (digest §2.5); the trigger is the
paper's `len(Q) > p` (A6: its pseudocode and prose agree; `strict_trigger=False` gives `>= p`, with
which a group launches the moment p are ready and BAG has nobody to leave out: at n = 16 selective
reduce is then P-Reduce). P-Reduce launches at p. Only LAUNCH launches (A4).

Time is whatever clock the caller uses (seconds). Metrics (`summary`): sync time from launch to done
(Fig. 3's CT, A20) and from each member's READY to done, scale, syncs, iterations per worker, wasted
wait (a WAIT_REPLACE followed by a window without any READY is charged to every waiting member,
digest §4), starvation (the longest any worker went without joining a sync).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .selection import LAUNCH, PROB_MODELS, WAIT_REPLACE, Ecdf, Training, bag, bpawr, ready_prob

SCHEMES = ("sr", "pr", "ar", "pa")
WEIGHTS = ("uniform", "staleness", "progress")
COLD_MIN_SAMPLES = 20  # cold start: never wait until this many rounds were observed (digest §3)


@dataclass(frozen=True)
class SelectiveConfig:
    """One scheme's parameters (digest §2.8). v_mbit and the bandwidths share a unit (Mbit, Mbit/s)."""

    scheme: str = "sr"
    p: int = 2
    eta: float = 0.3
    theta: float = 1.0
    dt: float = 0.01
    v_mbit: float = 1.0
    c: int | None = None  # every c-th sync is a full all-reduce; None: never
    prob_model: str = "paper"
    warm: bool = True  # the runtime CDF is known in advance (the samples given); False: built as rounds end
    strict_trigger: bool = True  # the paper's `len(Q) > p` (A6, pseudocode and prose); False: `>= p`
    bw_error: float = 0.0  # e: every pass sees b (1 + e x), x ~ U[-1, 1] per worker (A18: per query)
    weights: str = "staleness"  # inside a group (digest §2.6); full syncs are uniform
    seed: int = 1

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme: {self.scheme!r} is not one of {', '.join(SCHEMES)}")
        if isinstance(self.p, bool) or not isinstance(self.p, int) or self.p < 1:
            raise ValueError(f"p: the minimum group size must be an integer >= 1, got {self.p!r}")
        if not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"eta: must be in [0, 1], got {self.eta}")
        if not self.theta >= 0:
            raise ValueError(f"theta: must be >= 0 (inf: never wait), got {self.theta}")
        if not (self.dt > 0 and math.isfinite(self.dt)):
            raise ValueError(f"dt: the waiting slot must be a finite number of seconds > 0, got {self.dt}")
        if not (self.v_mbit > 0 and math.isfinite(self.v_mbit)):
            raise ValueError(f"v_mbit: the model size must be > 0, got {self.v_mbit}")
        if self.c is not None and (isinstance(self.c, bool) or not isinstance(self.c, int) or self.c < 1):
            raise ValueError(f"c: a full all-reduce every c syncs needs an integer c >= 1 (or None), got {self.c!r}")
        if self.prob_model not in PROB_MODELS:
            raise ValueError(f"prob_model: {self.prob_model!r} is not one of {', '.join(PROB_MODELS)}")
        if not 0.0 <= self.bw_error < 1.0:
            raise ValueError(f"bw_error: must be in [0, 1), got {self.bw_error}")
        if self.weights not in WEIGHTS:
            raise ValueError(f"weights: {self.weights!r} is not one of {', '.join(WEIGHTS)}")


@dataclass
class Launch:
    """A group to synchronize now: its members, the iteration each contributes, their weights."""

    gid: int
    members: tuple[int, ...]
    iters: dict[int, int]
    weights: dict[int, float]  # sum 1 (a weighted average)
    kind: str  # "partial" or "full"


@dataclass
class SyncStat:
    gid: int
    members: tuple[int, ...]
    kind: str
    t_launch: float
    t_ready: dict[int, float]  # member -> its READY
    t_done: float | None = None
    aborted: bool = False


@dataclass
class _Worker:
    round_start: float
    iteration: int = -1  # last iteration reported READY
    tau: int = 0  # model version for staleness weights (digest §2.6)
    state: str = "training"  # training | queued | syncing | gone
    t_ready: float = 0.0
    last: bool = False  # reported its last iteration
    joins: list[float] = field(default_factory=list)  # launch times of the syncs it joined
    wasted: float = 0.0


class Controller:
    def __init__(self, cfg: SelectiveConfig, workers: Iterable[int], bandwidth: Mapping[int, float], *,
                 t0: float = 0.0, samples: Sequence[float] = ()) -> None:
        """bandwidth: each worker's b = min(up, down) (Mbit/s); samples: the known runtime distribution
        (warm start); t0: when every worker began its first round."""
        self.cfg = cfg
        self.t0 = t0
        self.w: dict[int, _Worker] = {n: _Worker(t0) for n in sorted(workers)}
        if not self.w:
            raise ValueError("workers: the controller needs at least one worker")
        missing = [n for n in self.w if n not in bandwidth]
        if missing:
            raise ValueError(f"bandwidth: no bandwidth for workers {missing[:8]}")
        bad = [n for n in self.w if not (bandwidth[n] > 0 and math.isfinite(bandwidth[n]))]
        if bad:
            raise ValueError(f"bandwidth: workers {bad[:8]} have no positive finite bandwidth")
        self.bw = {n: float(bandwidth[n]) for n in self.w}
        self.F = Ecdf(samples if cfg.warm else ())
        self.rng = random.Random(f"selective/{cfg.seed}")
        self.queue: dict[int, None] = {}  # ready workers in arrival order (a dict keeps insertion order)
        self.syncs: dict[int, SyncStat] = {}
        self.K = 0  # syncs launched (full ones too, A7)
        self.wake_at: float | None = None
        self._pending_wait: tuple[float, tuple[int, ...]] | None = None
        self.decisions = {"launch": 0, "wait_replace": 0, "wait_too_few": 0}
        self.passes = 0
        self.now = t0
        self._arrived = False  # a READY came since the last pass

    # --- events ------------------------------------------------------------------------------------
    def ready(self, w: int, iteration: int, t: float, last: bool = False, defer: bool = False) -> list[Launch]:
        """Worker w finished its round `iteration` (last: it has no round after this one). defer: more
        READYs of the same instant follow; the pass waits for the last of them (A21: drain, then pass)."""
        st = self._worker(w)
        if st.state == "gone":
            return []
        if st.state == "syncing" and iteration <= st.iteration:
            return []  # its group's attempt was aborted: the scheduler retries that task, it is still in it
        self._arrived = True
        if st.state == "syncing":  # its result arrived (and it computed on) before the group's end reached us
            st.state = "training"
        elif st.state == "training" and not self.cfg.warm:
            self.F.add(t - st.round_start)
        if st.state != "queued":
            st.state, st.tau = "queued", st.tau + 1
            self.queue[w] = None
        if iteration != st.iteration:  # (a repeated READY of the same iteration keeps its place and time)
            st.iteration, st.t_ready, st.last = iteration, t, last
        return [] if defer else self._pass(t, arrival=True)

    def done(self, gid: int, t: float, back: Mapping[int, float] | None = None, t_end: float | None = None
             ) -> list[Launch]:
        """Group gid's sync ended (t_end, default t); each member resumed training at back[m]."""
        s = self.syncs[gid]
        s.t_done = t if t_end is None else t_end
        top = max(self.w[m].tau for m in s.members)
        for m in s.members:
            st = self.w[m]
            st.tau = max(st.tau, top)  # every member now holds the group's newest model (digest §2.6)
            if st.state == "syncing":
                st.state = "gone" if st.last else "training"
            if st.state == "training":
                st.round_start = (back or {}).get(m, s.t_done)
        return self._pass(t, arrival=False)

    def aborted(self, gid: int, t: float) -> list[Launch]:
        """Nothing of group gid was applied: its members queue again, as they were."""
        s = self.syncs[gid]
        s.aborted = True
        self.K -= 1
        for m in s.members:
            st = self.w[m]
            if st.state == "syncing":
                st.state = "queued"
                self.queue[m] = None
        return self._pass(t, arrival=True)

    def lost(self, w: int, t: float) -> list[Launch]:
        st = self._worker(w)
        st.state = "gone"
        self.queue.pop(w, None)
        return self._pass(t, arrival=False)

    def tick(self, t: float) -> list[Launch]:
        """The waiting slot dt passed without a READY (the paper's GetReadyWorkerID timeout)."""
        return self._pass(t, arrival=False)

    # --- one pass ------------------------------------------------------------------------------------
    def _worker(self, w: int) -> _Worker:
        if w not in self.w:
            raise ValueError(f"worker {w} is not one of this controller's workers")
        return self.w[w]

    def _active(self) -> list[int]:
        return [n for n, st in self.w.items() if st.state != "gone"]

    def _pass(self, t: float, arrival: bool) -> list[Launch]:
        self.passes += 1
        t = max(t, self.now)
        self.now = t
        arrival, self._arrived = arrival or self._arrived, False
        if self._pending_wait is not None:
            t_wait, members = self._pending_wait
            self._pending_wait = None
            if not arrival:  # the window after a WAIT_REPLACE passed with nobody new: wasted
                for m in members:
                    self.w[m].wasted += t - t_wait
        self.wake_at = None
        cfg, out = self.cfg, []
        active = self._active()
        coming = [n for n in active if self.w[n].state != "queued"]  # may still queue (training, syncing)
        if not self.queue:
            return out
        if cfg.scheme == "ar" or (cfg.c is not None and (self.K + 1) % cfg.c == 0):
            if not coming:  # everyone is here: the full all-reduce (a barrier meanwhile)
                out.append(self._launch(list(self.queue), t, "full"))
            return out
        if cfg.scheme == "pr":
            while len(self.queue) >= cfg.p:
                out.append(self._launch(list(self.queue)[:cfg.p], t, "partial"))
        elif len(self.queue) > cfg.p or (len(self.queue) == cfg.p and not cfg.strict_trigger):
            out += self._sr_pass(t) if cfg.scheme == "sr" else self._pa_pass(t)
        # nobody else can come: the rest go (fewer than p can ever queue; or exactly p, everyone queued, which
        # the strict trigger, more than p, would wait on for ever)
        coming = [n for n in self._active() if self.w[n].state != "queued"]
        if self.queue and (len(self.queue) + len(coming) < cfg.p or (not coming and len(self.queue) >= cfg.p)):
            out.append(self._launch(list(self.queue), t, "partial"))
        return out

    def _snapshot(self) -> dict[int, float]:
        e = self.cfg.bw_error
        if e == 0:
            return self.bw
        return {n: b * (1 + e * self.rng.uniform(-1, 1)) for n, b in self.bw.items()}

    def _cdf(self) -> Ecdf:
        """Cold start: an empty CDF (never wait) until enough rounds were observed."""
        return self.F if self.cfg.warm or len(self.F) >= COLD_MIN_SAMPLES else Ecdf()

    def _training(self, t: float, B: Mapping[int, float]) -> list[Training]:
        return [Training(n, B[n], t - st.round_start) for n, st in self.w.items() if st.state == "training"]

    def _sr_pass(self, t: float) -> list[Launch]:
        cfg = self.cfg
        B = self._snapshot()
        S = self._training(t, B)
        F = self._cdf()
        G = bag(list(self.queue), cfg.p, cfg.eta, B)
        out, waiting = [], []
        for i in range(len(G)):
            dec, S = bpawr(S, G[i], cfg.p, cfg.eta, cfg.dt, cfg.v_mbit, B, cfg.theta, F, cfg.prob_model)
            self.decisions[dec.outcome] += 1
            if dec.g_delta and i + 1 < len(G):  # slow members join the next group
                G[i] = [w for w in G[i] if w not in set(dec.g_delta)]
                G[i + 1] = G[i + 1] + dec.g_delta
            if dec.outcome == LAUNCH:
                out.append(self._launch(G[i], t, "partial"))
            elif dec.outcome == WAIT_REPLACE:
                waiting += G[i]
        self._wait(t, waiting)
        return out

    def _pa_pass(self, t: float) -> list[Launch]:
        """Progress-aware only: one group of the whole queue, held while >= 1 more arrival is expected."""
        F = self._cdf()
        q = sum(ready_prob(F, t - st.round_start, self.cfg.dt, self.cfg.prob_model)
                for st in self.w.values() if st.state == "training")
        if math.floor(q + 1e-12) >= 1:
            self.decisions[WAIT_REPLACE] += 1
            self._wait(t, list(self.queue))
            return []
        self.decisions[LAUNCH] += 1
        return [self._launch(list(self.queue), t, "partial")]

    def _wait(self, t: float, members: list[int]) -> None:
        if members:
            self._pending_wait = (t, tuple(members))
            self.wake_at = t + self.cfg.dt

    def _launch(self, members: Sequence[int], t: float, kind: str) -> Launch:
        gid = len(self.syncs)
        members = tuple(sorted(members))
        for m in members:
            del self.queue[m]
            st = self.w[m]
            st.state = "syncing"
            st.joins.append(t)
        self.syncs[gid] = SyncStat(gid, members, kind, t, {m: self.w[m].t_ready for m in members})
        self.K += 1
        return Launch(gid, members, {m: self.w[m].iteration for m in members}, self._weights(members, kind), kind)

    def _weights(self, members: Sequence[int], kind: str) -> dict[int, float]:
        """Weights of the weighted average (sum 1): uniform; staleness 1/(1 + s_j), s_j = newest tau in
        the group - tau_j (DynSGD-style); progress tau_j. Full syncs are uniform."""
        how = "uniform" if kind == "full" else self.cfg.weights
        if how == "uniform":
            raw = {m: 1.0 for m in members}
        elif how == "staleness":
            top = max(self.w[m].tau for m in members)
            raw = {m: 1.0 / (1 + top - self.w[m].tau) for m in members}
        else:
            raw = {m: float(max(1, self.w[m].tau)) for m in members}
        total = sum(raw.values())
        return {m: x / total for m, x in raw.items()}

    # --- figures -------------------------------------------------------------------------------------
    def summary(self, t_end: float) -> dict[str, Any]:
        """What happened up to t_end: syncs over by then count; wasted wait and starvation per worker."""
        over = [s for s in self.syncs.values() if s.t_done is not None and s.t_done <= t_end and not s.aborted]
        partial = [s for s in over if s.kind == "partial"]
        span = max(1e-9, t_end - self.t0)
        iters = {n: 0 for n in self.w}
        for s in over:
            for m in s.members:
                iters[m] += 1
        ready_to_done = [s.t_done - tr for s in over for tr in s.t_ready.values()]  # type: ignore[operator]
        gaps = {}
        for n, st in self.w.items():
            joins = [self.t0, *[j for j in st.joins if j <= t_end], t_end]
            gaps[n] = max(b - a for a, b in zip(joins, joins[1:], strict=False))
        wasted = sum(st.wasted for st in self.w.values())
        return {
            "scheme": self.cfg.scheme, "workers": len(self.w), "p": self.cfg.p,
            "syncs": len(over), "partial_syncs": len(partial), "full_syncs": len(over) - len(partial),
            "mean_sync_s": statistics.fmean(s.t_done - s.t_launch for s in over) if over else None,  # type: ignore[operator]
            "mean_partial_sync_s": statistics.fmean(s.t_done - s.t_launch for s in partial) if partial else None,  # type: ignore[operator]
            "mean_ready_to_done_s": statistics.fmean(ready_to_done) if ready_to_done else None,
            "mean_scale": statistics.fmean(len(s.members) for s in over) if over else None,
            "iterations": sum(iters.values()), "iterations_per_worker": sum(iters.values()) / len(self.w),
            "iterations_min": min(iters.values()), "iterations_max": max(iters.values()),
            "wasted_wait_s": wasted, "wasted_wait_pct": 100.0 * wasted / (len(self.w) * span),
            "wasted_wait_per_worker_ms": 1000.0 * wasted / len(self.w),
            "starvation_s": max(gaps.values()), "decisions": dict(self.decisions), "passes": self.passes,
        }
