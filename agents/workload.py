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


def contribution(rnd: int, attempt: int, node: int, params: int, out: np.ndarray | None = None) -> np.ndarray:
    """f(r, a, n, i): integer-valued float32 in [-32, 31]."""
    i = np.arange(params, dtype=np.int64)
    vals = (i * 7 + node * 13 + rnd * 31 + attempt * 17 + (i >> 5) * node) % 64 - 32
    if out is None:
        return vals.astype(np.float32)
    np.copyto(out, vals, casting="unsafe")
    return out


def expected(rnd: int, attempt: int, nodes: Iterable[int], params: int,
             weights: Mapping[int, float] | None = None) -> np.ndarray:
    """The exact (weighted) sum of the given nodes' contributions."""
    total = np.zeros(params, dtype=np.float64)
    for n in nodes:
        w = 1.0 if weights is None else weights[n]
        total += w * contribution(rnd, attempt, n, params)
    return total.astype(np.float32)
