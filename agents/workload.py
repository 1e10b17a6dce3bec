"""Synthetic workloads: tensors sized like real models, contributions whose exact sum is known.

Contribution of node n in round r, attempt a, element i is an integer in [-32, 31] stored as
float32. Any sum of fewer than 2^19 of them is exact in float32 whatever the order, so every
scheme, tree and relay must produce a bit-identical result, checked with `==` after each round.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

# fp32 parameter counts (digest 002 §4; ImageNet heads unless stated)
MODELS: dict[str, int] = {
    "mobilenet": 4_200_000,
    "resnet18": 11_700_000,
    "resnet34": 21_800_000,
    "resnet50": 25_600_000,
    "resnet101": 44_500_000,
    "resnet152": 60_200_000,
    "alexnet": 57_030_000,  # Gluon AlexNet, 1-channel input, 10 classes (NetStorm's setup)
    "vgg16": 138_000_000,
    "vgg19": 144_000_000,
    "bert-base": 110_000_000,
}
# NetStorm's CHUNK_SIZE: 1 M parameters (4 MB) at full scale
CHUNK_PARAMS = 1_000_000


def model_params(model: str, scale: float = 1.0) -> int:
    """Parameter count of a named model (or a plain integer), shrunk by --scale."""
    if model in MODELS:
        n = MODELS[model]
    else:
        try:
            n = int(float(model))
        except ValueError:
            raise ValueError(f"unknown model {model!r}; use one of {', '.join(MODELS)} or a parameter count") from None
    if n <= 0 or scale <= 0:
        raise ValueError("model size and --scale must be positive")
    return max(1, round(n * scale))


def chunk_params(scale: float = 1.0, base: int = CHUNK_PARAMS) -> int:
    return max(1024, round(base * scale))


PERIOD = 2048  # f repeats every 2048 elements: 7 * 2048 and 2048 >> 5 are both multiples of 64
# Element i's cell: (7i mod 64) * 64 + ((13 + (i >> 5)) mod 64), over one period. f mod 64 depends on i
# only through these two residues, so a sum of contributions is a sum of 4096-entry tables, looked up
# for one period and repeated.
_I = np.arange(PERIOD, dtype=np.int64)
_CELLS = (_I * 7 % 64) * 64 + (13 + (_I >> 5)) % 64


def _spread(table: np.ndarray, params: int) -> np.ndarray:
    """The values of every element from a table by cell: one period looked up, then repeated."""
    return np.resize(table[_CELLS], params)


_U, _V = (a.ravel() for a in np.meshgrid(np.arange(64, dtype=np.uint8), np.arange(64, dtype=np.uint8), indexing="ij"))


def _raw_table(rnd: int, attempt: int, node: int) -> np.ndarray:
    """(7i + 13n + 31r + 17a + (i >> 5) n) mod 64 for every cell (uint8 wraps; 64 divides 256, so `& 63`
    stays exact): the contribution's values, by cell."""
    out = np.multiply(_V, np.uint8(node % 256))
    out += _U
    out += np.uint8((31 * rnd + 17 * attempt) % 256)
    out &= 63
    return out


def contribution(rnd: int, attempt: int, node: int, params: int) -> np.ndarray:
    """f(r, a, n, i): integer-valued float32 in [-32, 31]."""
    table = _raw_table(rnd, attempt, node).astype(np.float32)
    table -= 32
    return _spread(table, params)


def expected_period(rnd: int, attempt: int, nodes: Iterable[int], weights: Mapping[int, float] | None = None,
                    iters: Mapping[int, int] | None = None) -> np.ndarray:
    """One period (PERIOD elements) of the exact (weighted) sum of the given nodes' contributions, of
    round `rnd` or each node's own iteration (`iters`: a ready queue groups workers at different
    iterations); element i of the sum is element i mod PERIOD of this. Summed per cell (4096 of
    them), in the same order and precision per element as summing the whole contributions."""
    nodes = list(nodes)
    it = {n: (rnd if iters is None else iters.get(n, rnd)) for n in nodes}
    if weights is None or all(weights[n] == 1.0 for n in nodes):
        total = np.zeros(_U.size, dtype=np.int32)
        for n in nodes:
            total += _raw_table(it[n], attempt, n)
        total -= 32 * len(nodes)
        return total.astype(np.float32)[_CELLS]
    acc = np.zeros(_U.size, dtype=np.float64)
    for n in nodes:
        values = _raw_table(it[n], attempt, n).astype(np.float32)
        values -= 32
        acc += weights[n] * values
    return acc.astype(np.float32)[_CELLS]


def expected(rnd: int, attempt: int, nodes: Iterable[int], params: int,
             weights: Mapping[int, float] | None = None, iters: Mapping[int, int] | None = None) -> np.ndarray:
    """The exact (weighted) sum of the given nodes' contributions, every element (see expected_period)."""
    return np.resize(expected_period(rnd, attempt, nodes, weights, iters), params)


CHECK_ROWS = 256  # periods compared at a time: 2 MB of float32, a block that stays in cache


def mismatches(result: np.ndarray, period: np.ndarray) -> int:
    """How many elements of `result` differ from the periodic sum whose one period is `period`
    (NaN differs from everything), compared a block of periods at a time against the period itself:
    no array the model's size is made (the receiver's check costs one read of the result)."""
    if result.ndim != 1 or period.shape != (PERIOD,):
        raise ValueError(f"a flat result and one period of {PERIOD} elements, got {result.shape} and {period.shape}")
    whole = result.size // PERIOD
    rows = result[: whole * PERIOD].reshape(whole, PERIOD)
    bad = 0
    for i in range(0, whole, CHECK_ROWS):
        bad += int(np.count_nonzero(rows[i : i + CHECK_ROWS] != period))
    tail = result[whole * PERIOD :]
    return bad + int(np.count_nonzero(tail != period[: tail.size]))
