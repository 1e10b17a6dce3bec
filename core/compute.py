"""How long a worker computes each iteration: seeded draws the agents sleep for and the simulator replays.

A compute model is a spec string, so the launcher, every agent and the simulator build the same
one and draw the same numbers: a draw depends only on (seed, node, iteration), never on who asks
first. Models:

    constant:S                        every node, every iteration: S seconds
    normal:mean=M,sd=D[,spread=P]     node n's mean is M * (1 + P * u_n), u_n ~ U[-1, 1]; draws
                                      N(mean_n, D), cut at 0
    lognormal:mean=M,cv=C[,spread=P][,spike=Q]
                                      node n's mean as above; draws lognormal with that mean and
                                      coefficient of variation C (heavy-tailed stragglers); with
                                      probability Q a draw is multiplied by U[1.5, 2] (a spike)
    cnn:mean=M[,spike=Q]              the CNN-like runtime stand-in (seed 003, the paper's traces are
                                      lost): lognormal, cv 0.1, spikes with probability Q (default 0.05)
    transformer:mean=M                the Transformer-like stand-in: lognormal, cv 0.5
    csv:FILE                          a trace: lines `node,iteration,seconds`; a node's iterations
                                      beyond its last line repeat its trace from the start

Times are full-scale seconds; a scaled run shrinks them by its --scale (`scaled`).
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

STANDIN_CV = {"cnn": 0.1, "transformer": 0.5}  # digest 003 §4: the paper's Fig. 1 traces, as stand-ins
CNN_SPIKE = 0.05  # "occasional" 1.5-2x spikes: 1 round in 20
SPIKE_FACTOR = (1.5, 2.0)


class ComputeError(ValueError):
    """A compute model spec that cannot be used; says which part."""


@dataclass(frozen=True)
class ComputeModel:
    spec: str = "constant:0"
    seed: int = 1
    scale: float = 1.0
    _kind: str = field(default="constant", init=False)
    _args: dict[str, float] = field(default_factory=dict, init=False)
    _trace: dict[int, tuple[float, ...]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        kind, _, rest = self.spec.partition(":")
        args: dict[str, float] = {}
        trace: dict[int, tuple[float, ...]] = {}
        if kind == "constant":
            args["s"] = _number(rest or "0", "constant", "seconds")
        elif kind in ("normal", "lognormal", "cnn", "transformer"):
            known = {"normal": ("mean", "sd", "spread"), "lognormal": ("mean", "cv", "spread", "spike"),
                     "cnn": ("mean", "spike"), "transformer": ("mean",)}[kind]
            for part in filter(None, rest.split(",")):
                key, eq, value = part.partition("=")
                if not eq or key not in known:
                    raise ComputeError(f"compute model {self.spec!r}: unknown option {part!r} ({', '.join(known)})")
                args[key] = _number(value, kind, key)
            if kind in ("cnn", "transformer"):  # the runtime stand-ins (seed 003): lognormal with fixed cv
                args["cv"] = STANDIN_CV[kind]
                if kind == "cnn":
                    args.setdefault("spike", CNN_SPIKE)
                kind = "lognormal"
            if "mean" not in args:
                raise ComputeError(f"compute model {self.spec!r}: needs mean=SECONDS")
            args.setdefault("spread", 0.0)
            args.setdefault("sd" if kind == "normal" else "cv", 0.0)
            if not 0 <= args["spread"] < 1:
                raise ComputeError(f"compute model {self.spec!r}: spread must be in [0, 1)")
            args.setdefault("spike", 0.0)
            if not 0 <= args["spike"] <= 1:
                raise ComputeError(f"compute model {self.spec!r}: spike is a probability, in [0, 1]")
        elif kind == "csv":
            trace = _read_trace(Path(rest), self.spec)
        else:
            raise ComputeError(f"compute model {self.spec!r}: kind must be constant, normal, lognormal, cnn, "
                               "transformer or csv")
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_args", args)
        object.__setattr__(self, "_trace", trace)

    def scaled(self, scale: float) -> ComputeModel:
        return ComputeModel(self.spec, self.seed, self.scale * scale)

    def mean_of(self, node: int) -> float:
        """Node n's own mean (full scale)."""
        a = self._args
        if self._kind == "constant":
            return a["s"]
        if self._kind == "csv":
            trace = self._trace.get(node, (0.0,))
            return sum(trace) / len(trace)
        u = random.Random(f"{self.seed}/mean/{node}").uniform(-1, 1)
        return a["mean"] * (1 + a["spread"] * u)

    def draw(self, node: int, iteration: int) -> float:
        """Seconds node `node` computes iteration `iteration`, scaled; the same for every caller."""
        a = self._args
        if self._kind == "constant":
            s = a["s"]
        elif self._kind == "csv":
            trace = self._trace.get(node, (0.0,))
            s = trace[iteration % len(trace)]
        else:
            rng = random.Random(f"{self.seed}/draw/{node}/{iteration}")
            mean = self.mean_of(node)
            if self._kind == "normal":
                s = max(0.0, rng.gauss(mean, a["sd"]))
            else:  # lognormal with this mean and coefficient of variation
                sigma = math.sqrt(math.log(1 + a["cv"] ** 2))
                s = rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma) if mean > 0 else 0.0
                if a["spike"] and rng.random() < a["spike"]:  # occasional contention: 1.5-2x
                    s *= rng.uniform(*SPIKE_FACTOR)
        return s * self.scale


def _number(text: str, kind: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ComputeError(f"compute model {kind}: {what} {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ComputeError(f"compute model {kind}: {what} must be a finite number >= 0, got {text}")
    return value


def _read_trace(path: Path, spec: str) -> dict[int, tuple[float, ...]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ComputeError(f"compute model {spec!r}: cannot read {path}: {exc.strerror}") from None
    rows: dict[int, dict[int, float]] = {}
    for i, row in enumerate(csv.reader(lines), 1):
        if not row or row[0].startswith("#") or row[0].strip() == "node":
            continue
        if len(row) != 3:
            raise ComputeError(f"{path}:{i}: expected node,iteration,seconds")
        try:
            node, it, s = int(row[0]), int(row[1]), float(row[2])
        except ValueError:
            raise ComputeError(f"{path}:{i}: expected node,iteration,seconds as numbers") from None
        if node < 0 or it < 0 or not math.isfinite(s) or s < 0:
            raise ComputeError(f"{path}:{i}: node and iteration >= 0, seconds finite and >= 0")
        rows.setdefault(node, {})[it] = s
    if not rows:
        raise ComputeError(f"{path}: no rows")
    return {n: tuple(v for _, v in sorted(its.items())) for n, its in rows.items()}
