"""Real training as a workload: a numpy MLP trained data-parallel on scikit-learn's bundled digits.

Every worker holds the same initial model (seeded), its own shard of the training split (IID, or
label-skewed: the split sorted by label and cut into 2n pieces, two per worker, as FedAvg's
pathological non-IID), and per round takes `steps` mini-batch SGD steps on real gradients (ReLU MLP,
softmax cross-entropy, backprop written out in numpy). What it contributes to a synchronization is
its locally updated model (the paper's "locally updated model values"); the group's weighted sum
(weights sum to 1) is the weighted average every member continues from.

Checks. Within a group every receiver holds the same bytes (the scheduler compares digests). Against
a reference: float32 sums are not exact, so the result of m weighted contributions is compared with
the float64 reference sum_j w_j x_j within the worst-case rounding of m products and m - 1 additions
in any order, elementwise

    |r_i - sum_j w_j x_ji| <= (m + 1) u sum_j w_j |x_ji|,   u = 2^-24 (float32's unit roundoff)

(Higham's gamma_{m+1}). A receiver cannot see the members' models, so the contribution carries its
own check in band: after the model come K = 4 sketch values R x (R seeded +-1 signs, the same on
every worker, repeating with a prime period so they stay 8 MB whatever the model: core.sketch)
and ||x||_1. Summation is linear, so the result's trailer holds sum_j w_j R x_j and
sum_j w_j ||x_j||_1, and a receiver checks |R r - trailer| <= 2 (m + 2) u (sum_j w_j ||x_j||_1) per
sketch row: the bound above summed over elements, for both the model and the trailer. A value that
is not the weighted sum of whole contributions — corrupted, landed at the wrong offset, a chunk of
another round mixed in — breaks it (unless below that tolerance); a missing or doubled contribution
is still a consistent sum, and is what the engine's contributor bitmaps catch, for every workload.
Tests also compare elementwise with a numpy reference. The integer workload (agents/workload.py)
keeps `==`.

Spec (the JOB's `workload`): "digits:n=16[,hidden=512x320][,batch=32][,lr=0.1][,steps=2]
[,shard=iid|noniid][,eval=1.0][,seed=1]". 64-512-320-10 has 200,650 parameters (0.80 MB of float32).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import numpy as np

from core import sketch

U32 = sketch.U32
TRAILER = sketch.trailer_len()  # the sketch rows, then the L1 norm
TEST_FRACTION = 0.2
SHARDS = ("iid", "noniid")


class WorkloadError(ValueError):
    """A workload spec that cannot be used; says which part."""


@dataclass(frozen=True)
class TrainingSpec:
    n: int  # workers the training split is sharded across
    data: str = "digits"
    hidden: tuple[int, ...] = (512, 320)
    batch: int = 32
    lr: float = 0.1
    steps: int = 2  # local SGD steps per round
    shard: str = "iid"
    eval_s: float = 1.0  # a worker evaluates held-out accuracy at most this often (wall clock)
    seed: int = 1

    @classmethod
    def parse(cls, spec: str) -> TrainingSpec:
        data, _, rest = spec.partition(":")
        if data != "digits":
            raise WorkloadError(f"workload {spec!r}: data set must be digits (scikit-learn's bundled one)")
        kw: dict[str, Any] = {}
        for part in filter(None, rest.split(",")):
            key, eq, value = part.partition("=")
            try:
                if not eq:
                    raise ValueError
                if key in ("n", "batch", "steps", "seed"):
                    kw[key] = int(value)
                elif key in ("lr", "eval"):
                    kw["eval_s" if key == "eval" else key] = float(value)
                elif key == "hidden":
                    kw[key] = tuple(int(h) for h in value.split("x"))
                elif key == "shard":
                    kw[key] = value
                else:
                    raise WorkloadError(f"workload {spec!r}: unknown option {key!r} "
                                        "(n, hidden, batch, lr, steps, shard, eval, seed)")
            except ValueError as exc:
                if isinstance(exc, WorkloadError):
                    raise
                raise WorkloadError(f"workload {spec!r}: {part!r} is not KEY=NUMBER") from None
        if "n" not in kw:
            raise WorkloadError(f"workload {spec!r}: needs n=WORKERS (how many shards)")
        out = cls(**kw)
        out.check(spec)
        return out

    def check(self, spec: str = "") -> None:
        where = f"workload {spec or self.to_spec()!r}"
        if self.n < 1 or self.batch < 1 or self.steps < 1 or self.seed < 0:
            raise WorkloadError(f"{where}: n, batch and steps must be >= 1, seed >= 0")
        if not self.hidden or any(h < 1 for h in self.hidden):
            raise WorkloadError(f"{where}: hidden layers must have >= 1 unit each")
        if not (self.lr > 0 and math.isfinite(self.lr)) or not (self.eval_s >= 0 and math.isfinite(self.eval_s)):
            raise WorkloadError(f"{where}: lr must be > 0 and eval >= 0")
        if self.shard not in SHARDS:
            raise WorkloadError(f"{where}: shard must be iid or noniid, got {self.shard!r}")

    def to_spec(self) -> str:
        return (f"{self.data}:n={self.n},hidden={'x'.join(map(str, self.hidden))},batch={self.batch},lr={self.lr:g},"
                f"steps={self.steps},shard={self.shard},eval={self.eval_s:g},seed={self.seed}")

    @property
    def layers(self) -> tuple[int, ...]:
        return (64, *self.hidden, 10)

    @property
    def model_params(self) -> int:
        ls = self.layers
        return sum(a * b + b for a, b in zip(ls, ls[1:], strict=False))

    @property
    def vector_params(self) -> int:
        """What a member contributes: the model and its check trailer (a job's `params`)."""
        return self.model_params + TRAILER


# --- data -----------------------------------------------------------------------------------------------
_load_lock = threading.Lock()


@lru_cache(maxsize=2)
def digits_split(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits (1,797 8x8 images, no download), pixels / 16 as float32, split
    seeded and stratified: 80 % training, 20 % held out."""
    with _load_lock:
        from sklearn.datasets import load_digits  # a second of imports: only for training jobs
        d = load_digits()
    X, y = d.data.astype(np.float32) / 16.0, d.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    test = np.zeros(len(y), bool)
    for c in range(10):
        idx = np.flatnonzero(y == c)
        test[rng.choice(idx, int(round(TEST_FRACTION * len(idx))), replace=False)] = True
    return X[~test], y[~test], X[test], y[test]


def shard(y: np.ndarray, n: int, how: str, seed: int) -> list[np.ndarray]:
    """Training indices per worker: iid (a seeded permutation cut in n) or noniid (sorted by label,
    cut in 2n pieces, each worker two of them at random: mostly two digits each)."""
    rng = np.random.default_rng(seed + 1)
    if how == "iid":
        return [np.sort(p) for p in np.array_split(rng.permutation(len(y)), n)]
    order = np.argsort(y, kind="stable")
    pieces = np.array_split(order, 2 * n)
    pick = rng.permutation(2 * n)
    return [np.sort(np.concatenate([pieces[pick[2 * i]], pieces[pick[2 * i + 1]]])) for i in range(n)]


# --- the model --------------------------------------------------------------------------------------------
def init_model(spec: TrainingSpec) -> np.ndarray:
    """He-uniform weights, zero biases, flat float32; the same on every worker (the spec's seed)."""
    rng = np.random.default_rng(spec.seed)
    parts = []
    for a, b in zip(spec.layers, spec.layers[1:], strict=False):
        lim = math.sqrt(6.0 / a)
        parts += [rng.uniform(-lim, lim, a * b).astype(np.float32), np.zeros(b, np.float32)]
    return np.concatenate(parts)


def unpack(spec: TrainingSpec, flat: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Views (W, b) per layer into the flat vector."""
    out, off = [], 0
    for a, b in zip(spec.layers, spec.layers[1:], strict=False):
        W = flat[off:off + a * b].reshape(a, b)
        off += a * b
        out.append((W, flat[off:off + b]))
        off += b
    return out


def gradient(spec: TrainingSpec, flat: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Mean softmax cross-entropy over the batch and its gradient (flat), by backprop."""
    layers = unpack(spec, flat)
    acts = [X]
    h = X
    for i, (W, b) in enumerate(layers):
        h = h @ W + b
        if i < len(layers) - 1:
            h = np.maximum(h, 0.0)
        acts.append(h)
    z = acts[-1] - acts[-1].max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
    delta = p
    delta[np.arange(len(y)), y] -= 1.0
    delta /= len(y)
    grads: list[np.ndarray] = []
    for i in range(len(layers) - 1, -1, -1):
        W, _ = layers[i]
        grads = [(acts[i].T @ delta).ravel(), delta.sum(axis=0), *grads]
        if i > 0:
            delta = (delta @ W.T) * (acts[i] > 0)
    return np.concatenate(grads).astype(np.float32), loss


def accuracy(spec: TrainingSpec, flat: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
    h = X
    layers = unpack(spec, flat)
    for i, (W, b) in enumerate(layers):
        h = h @ W + b
        if i < len(layers) - 1:
            h = np.maximum(h, 0.0)
    return float((h.argmax(axis=1) == y).mean())


# --- the check trailer --------------------------------------------------------------------------------------
def with_trailer(spec: TrainingSpec, model: np.ndarray) -> np.ndarray:
    """A member's contribution: the model, then R x and ||x||_1 (float32; core.sketch)."""
    return np.concatenate([model, sketch.trailer(model, spec.seed).astype(np.float32)])


def check_result(spec: TrainingSpec, result: np.ndarray, m: int) -> tuple[bool, str]:
    """The in-band check of a weighted sum of m contributions (see the module docstring)."""
    P = spec.model_params
    if result.shape != (P + TRAILER,):
        return False, f"result has {result.size} elements, the workload {P + TRAILER}"
    return sketch.check(result, P, m, spec.seed)


# --- one worker --------------------------------------------------------------------------------------------
@dataclass
class Trainer:
    """One worker's model, shard and accuracy log."""

    spec: TrainingSpec
    node: int
    model: np.ndarray = field(init=False)
    log: list[list[float]] = field(default_factory=list)  # [time, iteration, held-out accuracy]
    losses: list[float] = field(default_factory=list)
    _prev: np.ndarray | None = None
    _last_eval: float = -math.inf

    def __post_init__(self) -> None:
        Xtr, ytr, self.X_test, self.y_test = digits_split(self.spec.seed)
        mine = shard(ytr, self.spec.n, self.spec.shard, self.spec.seed)[self.node % self.spec.n]
        self.X, self.y = Xtr[mine], ytr[mine]
        self.model = init_model(self.spec)

    def step(self, rnd: int) -> np.ndarray:
        """One round of local training (`steps` SGD mini-batches, seeded per worker and round); returns
        the contribution: the updated model and its check trailer."""
        rng = np.random.default_rng([self.spec.seed, self.node, rnd])
        for _ in range(self.spec.steps):
            idx = rng.choice(len(self.y), min(self.spec.batch, len(self.y)), replace=False)
            g, loss = gradient(self.spec, self.model, self.X[idx], self.y[idx])
            self.model = self.model - np.float32(self.spec.lr) * g
            self.losses.append(loss)
        return with_trailer(self.spec, self.model)

    def apply(self, result: np.ndarray, weights: dict[int, float]) -> None:
        """The group's weighted sum becomes this worker's model (divided by the float32 weights' sum,
        which the engine used)."""
        total = float(sum(np.float32(w) for w in weights.values()))
        self._prev = self.model
        self.model = (result[:self.spec.model_params].astype(np.float64) / total).astype(np.float32)

    def undo(self) -> None:
        if self._prev is not None:
            self.model, self._prev = self._prev, None

    def maybe_evaluate(self, now: float, iteration: int) -> float | None:
        """Held-out accuracy, at most every eval_s seconds (recorded with the time and iteration)."""
        if now - self._last_eval < self.spec.eval_s:
            return None
        self._last_eval = now
        acc = accuracy(self.spec, self.model, self.X_test, self.y_test)
        self.log.append([now, iteration, acc])
        return acc

    def stats(self) -> dict[str, Any]:
        return {"workload": self.spec.to_spec(), "accuracy": self.log,
                "loss_last": self.losses[-1] if self.losses else None, "model_params": self.spec.model_params}


def parse(spec: str | None) -> TrainingSpec | None:
    return None if not spec else TrainingSpec.parse(spec)


def spec_with(spec: TrainingSpec, **kw: Any) -> TrainingSpec:
    out = replace(spec, **kw)
    out.check()
    return out
