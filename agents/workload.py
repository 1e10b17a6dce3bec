"""Synthetic workloads: tensors sized like real models, contributions whose exact sum is known.

Contribution of node n in round r, attempt a, element i is an integer in [-32, 31] stored as
float32. Any sum of fewer than 2^19 of them is exact in float32 whatever the order, so every
scheme, tree and relay must produce a bit-identical result, checked with `==` after each round.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache

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


@lru_cache(maxsize=4)
def _basis(params: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-element terms of f, reduced mod 256 (uint8 wraps; 64 divides 256, so `& 63` stays exact)."""
    i = np.arange(params, dtype=np.int64)
    return (i * 7 % 256).astype(np.uint8), ((13 + (i >> 5)) % 256).astype(np.uint8)


def _raw(rnd: int, attempt: int, node: int, params: int) -> np.ndarray:
    """(7i + 13n + 31r + 17a + (i >> 5) n) mod 64, computed in uint8 without any int64 temporaries."""
    u, v = _basis(params)
    out = np.multiply(v, np.uint8(node % 256))
    out += u
    out += np.uint8((31 * rnd + 17 * attempt) % 256)
    out &= 63
    return out


def contribution(rnd: int, attempt: int, node: int, params: int) -> np.ndarray:
    """f(r, a, n, i): integer-valued float32 in [-32, 31]."""
    out = _raw(rnd, attempt, node, params).astype(np.float32)
    out -= 32
    return out


def expected(rnd: int, attempt: int, nodes: Iterable[int], params: int,
             weights: Mapping[int, float] | None = None, iters: Mapping[int, int] | None = None) -> np.ndarray:
    """The exact (weighted) sum of the given nodes' contributions, of round `rnd` or each node's own
    iteration (`iters`: a ready queue groups workers at different iterations)."""
    nodes = list(nodes)
    it = {n: (rnd if iters is None else iters.get(n, rnd)) for n in nodes}
    if weights is None or all(weights[n] == 1.0 for n in nodes):
        total = np.zeros(params, dtype=np.int32)
        for n in nodes:
            total += _raw(it[n], attempt, n, params)
        total -= 32 * len(nodes)
        return total.astype(np.float32)
    acc = np.zeros(params, dtype=np.float64)
    for n in nodes:
        acc += weights[n] * contribution(it[n], attempt, n, params)
    return acc.astype(np.float32)
