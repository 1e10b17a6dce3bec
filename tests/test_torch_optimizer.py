"""wt.Optimizer on real torch ranks (Gloo on 127.0.0.1, GlooSync as the data plane): grad mode is DDP's
math, model and outer modes reach what a one-process simulation of every rank computes, every rank
starts from rank 0's model, GradScaler overflows skip the step everywhere, a non-finite contribution
stops every rank naming the culprit."""

import copy
import json

import pytest
import torch
from helpers.torchrank import LR, STEPS, batch, loss_of, make_model, ranks

pytestmark = [pytest.mark.loopback, pytest.mark.torch, pytest.mark.timeout(180)]

WORLD = 2


def trained(d):
    """The parameters (running statistics left out: they are compared where they matter)."""
    return {k: v for k, v in d.items() if "running" not in k and "num_batches" not in k}


def assert_close(a, b, atol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=1e-5, msg=lambda m, k=k: f"{k}: {m}")


def test_grad_mode_equals_plain_ddp_and_starts_every_rank_from_rank_0(tmp_path):
    out = ranks("grad", 3, tmp_path)  # three: the average is not a power-of-two division
    rank0_before = out[0]["before"]
    for rank, r in enumerate(out):
        # the initial broadcast: parameters and BatchNorm buffers are rank 0's, whatever this rank's seed
        assert_close(r["attached"], rank0_before, atol=0)
        if rank:
            assert not torch.equal(r["before"]["0.weight"], rank0_before["0.weight"])
            assert not torch.equal(r["before"]["1.running_mean"], rank0_before["1.running_mean"])
        # five steps: what plain DDP (no hook, same data, same momentum SGD) reaches
        assert_close(trained(r["final"]), trained(r["reference"]))
        assert not torch.equal(r["final"]["0.weight"], rank0_before["0.weight"])  # it did train
    for r in out[1:]:
        assert_close(r["final"], out[0]["final"], atol=0)  # BatchNorm running stats averaged alike
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "step" in m]
    assert sorted((m["rank"], m["step"]) for m in steps) == [(r, s) for r in range(3) for s in range(STEPS)]
    # and what the launcher reads: when each rank attached (its summary comes at exit)
    assert sorted(m["rank"] for m in lines if m.get("attached")) == [0, 1, 2]


def simulate(mode, sync_every=2):
    """Every rank in this process: local momentum SGD on its own batches from rank 0's model; every
    `sync_every` steps the average (model) or a DiLoCo outer step (outer)."""
    start = make_model(seed=0)
    models = [copy.deepcopy(start) for _ in range(WORLD)]
    opts = [torch.optim.SGD(m.parameters(), lr=LR, momentum=0.9) for m in models]
    outer = [p.detach().clone() for p in start.parameters()]
    outer_opt = torch.optim.SGD(outer, lr=0.7, momentum=0.9, nesterov=True)
    for step in range(STEPS):
        for rank, (m, o) in enumerate(zip(models, opts, strict=False)):
            o.zero_grad()
            loss_of(m, rank, step).backward()
            o.step()
        if (step + 1) % sync_every:
            continue
        with torch.no_grad():
            per_rank = [list(m.parameters()) for m in models]
            if mode == "model":
                for ps in zip(*per_rank, strict=False):
                    avg = sum(p.clone() for p in ps) / WORLD
                    for p in ps:
                        p.copy_(avg)
            else:
                for i, q in enumerate(outer):
                    q.grad = sum(q - ps[i] for ps in per_rank) / WORLD
                outer_opt.step()
                for ps in per_rank:
                    for p, q in zip(ps, outer, strict=False):
                        p.copy_(q)
    return [{k: v.detach() for k, v in m.state_dict().items()} for m in models]


@pytest.mark.parametrize("mode", ["model", "outer"])
def test_model_and_outer_modes_reach_the_simulation_of_every_rank(tmp_path, mode):
    out = ranks(mode, WORLD, tmp_path)
    reference = simulate(mode)
    for rank in range(WORLD):
        assert_close(out[rank]["final"], reference[rank], atol=1e-5)
    # step 5 is local after the sync at step 4: the ranks differ again, as in the simulation
    assert not torch.equal(out[0]["final"]["0.weight"], out[1]["final"]["0.weight"])
    # and the simulation is not trivially met: without the outer step (plain averaging) it differs
    other = simulate("model" if mode == "outer" else "outer")
    assert not torch.allclose(out[0]["final"]["0.weight"], other[0]["0.weight"], atol=1e-4)


def test_a_gradscaler_overflow_on_one_rank_skips_the_step_on_every_rank_as_ddp_does(tmp_path):
    out = ranks("scaler", WORLD, tmp_path)
    for r in out:
        assert r["skipped"] == [False, False, True, False, False]  # rank 1 overflowed at step 2
        assert_close(r["final"], r["reference"])


def test_a_non_finite_contribution_raises_sync_error_naming_the_rank_on_every_rank(tmp_path):
    out = ranks("nonfinite", WORLD, tmp_path)
    for r in out:
        assert r["error"] is not None and "rank 1" in r["error"] and "not finite" in r["error"]


def test_batches_differ_per_rank():
    """The comparisons above mean something only if the ranks see different data."""
    assert not torch.equal(batch(0, 0)[0], batch(1, 0)[0])
