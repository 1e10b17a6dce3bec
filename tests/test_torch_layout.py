"""The model's layout and the optimizer's own state, in one process: a one-rank data plane that
returns its buffer stands in for the ranks (the sums themselves are tested on real ranks in
test_torch_optimizer.py)."""

import copy
import subprocess
import sys
import textwrap

import msgpack
import numpy as np
import pytest
import torch

import wansync.torch as wt
from wansync.torch import plane
from wansync.torch.layout import Tensors, describe, difference

pytestmark = [pytest.mark.unit, pytest.mark.torch]


class OneRank:
    """Sync for a world of one: the sum of every member's buffer is this buffer."""

    rank, world = 0, 1

    def __init__(self, params: int) -> None:
        self.params = params
        self.buf = torch.zeros(params)
        self.calls = 0
        self.logged: list[dict] = []

    def buffer(self):
        return self.buf

    def folder(self):
        return None

    def allreduce(self):
        self.calls += 1
        return wt.Reduced(self.buf.clone(), 1.0, (0,))

    def log(self, **metrics):
        self.logged.append(metrics)

    def close(self):
        pass


def one_rank(model):
    return OneRank(Tensors.of(model).layout.flat_size)


class Net(torch.nn.Module):
    def __init__(self, hidden=64, extra=False):
        super().__init__()
        self.body = torch.nn.Linear(4, hidden)
        self.fc = torch.nn.Linear(hidden, 10)
        if extra:
            self.head = torch.nn.Linear(10, 2)


def test_difference_names_the_tensor_shape_dtype_and_counts():
    here = Tensors.of(Net(64)).layout
    assert difference(here, Tensors.of(Net(64)).layout) is None
    assert difference(here, Tensors.of(Net(32)).layout) == "tensor 0 'body.weight': shape [64, 4] here, [32, 4] there"
    half = Net(64)
    half.fc.half()
    assert difference(here, Tensors.of(half).layout) == "tensor 2 'fc.weight': dtype float32 here, float16 there"
    assert difference(here, Tensors.of(Net(64, extra=True)).layout) == "4 parameters here, 6 there"
    bn = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3, affine=False))
    no_bn = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Identity())
    assert difference(Tensors.of(bn).layout, Tensors.of(no_bn).layout) == "2 floating buffers here, 0 there"
    # what a data plane exchanges between ranks: the msgpack'd description
    wire = msgpack.unpackb(msgpack.packb(describe(here)))
    assert difference(wire, here) is None
    assert "'body.weight'" in difference(wire, Tensors.of(Net(32)).layout)


def test_layout_orders_params_then_persistent_floating_buffers_then_the_flag():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    model.register_buffer("mask", torch.ones(5), persistent=False)
    layout = Tensors.of(model).layout
    assert [s.name for s in layout.params] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert [s.name for s in layout.buffers] == ["1.running_mean", "1.running_var"]  # not num_batches_tracked, mask
    assert (layout.param_numel, layout.buffer_numel, layout.flat_size) == (12, 4, 17)
    model[0].bias.requires_grad_(False)
    assert "0.bias" not in [s.name for s in Tensors.of(model).layout.params]


def test_refused_dtypes_and_sparse_gradients_raise_naming_the_parameter():
    with pytest.raises(ValueError, match=r"parameter 'fc\.weight' is float64"):
        Tensors.of(torch.nn.ModuleDict({"fc": torch.nn.Linear(2, 2).double()}))
    with pytest.raises(ValueError, match=r"module 'emb' makes sparse gradients"):
        Tensors.of(torch.nn.ModuleDict({"emb": torch.nn.Embedding(5, 2, sparse=True)}))
    emb = torch.nn.Embedding(5, 2, sparse=True)  # given as bare parameters, caught at the first step
    opt = wt.Optimizer(torch.optim.SGD(emb.parameters(), lr=0.1), sync=OneRank(11))
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(ValueError, match=r"parameter 'param\.0' has a sparse gradient"):
        opt.step()


def test_half_precision_parameters_sync_in_float32_and_stay_half():
    model = torch.nn.Linear(4, 3).to(torch.bfloat16)
    sync = one_rank(model)
    opt = wt.Optimizer(torch.optim.SGD(model.parameters(), lr=0.5), model, sync=sync)
    before = model.weight.detach().clone()
    model(torch.ones(2, 4, dtype=torch.bfloat16)).sum().backward()
    grad = model.weight.grad.clone()
    opt.step()
    assert sync.buf.dtype == torch.float32 and model.weight.dtype == torch.bfloat16
    torch.testing.assert_close(model.weight, (before.float() - 0.5 * grad.float()).to(torch.bfloat16))


def test_a_data_plane_of_another_size_is_refused():
    model = torch.nn.Linear(4, 3)
    needs = r"holds 15 floats, the model needs 16 \(15 parameters, 0 buffer elements, 1 flag\)"
    with pytest.raises(ValueError, match=needs):
        wt.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, sync=OneRank(15))


def test_step_lr_changes_the_lr_the_steps_use():
    model = torch.nn.Linear(3, 1, bias=False)
    opt = wt.Optimizer(torch.optim.SGD(model.parameters(), lr=1.0), model, sync=one_rank(model))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
    used = []
    for _ in range(5):
        opt.zero_grad()
        before = model.weight.detach().clone()
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        sched.step()
        used.append(round(((before - model.weight) / model.weight.grad).mean().item(), 6))
    assert used == [1.0, 1.0, 0.1, 0.1, 0.01]
    assert opt.inner.param_groups[0]["lr"] == pytest.approx(0.01)


def run(model, opt, steps):
    for i in range(steps):
        opt.zero_grad()
        model(torch.full((2, 3), float(i + 1))).pow(2).sum().backward()
        opt.step()


def test_state_dict_round_trip_restores_inner_momentum_and_the_outer_state(tmp_path):
    def make(model):
        inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        return wt.Optimizer(inner, model, mode="outer", sync_every=2, sync=one_rank(model))

    a = torch.nn.Linear(3, 2)
    opt_a = make(a)
    run(a, opt_a, 3)
    torch.save({"model": a.state_dict(), "opt": opt_a.state_dict()}, tmp_path / "ckpt.pt")
    saved = torch.load(tmp_path / "ckpt.pt")
    assert saved["opt"]["wansync"]["steps"] == 3
    assert saved["opt"]["wansync"]["outer"]["state"][0]["momentum_buffer"] is not None
    assert saved["opt"]["inner"]["state"][0]["momentum_buffer"] is not None

    b, fresh = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    b.load_state_dict(saved["model"])
    fresh.load_state_dict(saved["model"])
    opt_b, opt_fresh = make(b), make(fresh)
    opt_b.load_state_dict(saved["opt"])
    assert opt_b.steps == 3
    for model, opt in ((a, opt_a), (b, opt_b), (fresh, opt_fresh)):
        run(model, opt, 3)  # crosses the sync at step 4 and 6
    torch.testing.assert_close(b.weight, a.weight, atol=0, rtol=0)
    assert not torch.allclose(fresh.weight, a.weight)  # without the state it differs: the round trip mattered


def test_closure_runs_before_the_sync_and_its_loss_is_returned():
    model = torch.nn.Linear(3, 1)
    sync = one_rank(model)
    opt = wt.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, sync=sync)
    calls_at_attach = sync.calls

    def closure():
        opt.zero_grad()
        loss = model(torch.ones(1, 3)).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor) and sync.calls == calls_at_attach + 1
    assert model.weight.grad is not None


def test_log_goes_to_the_current_data_plane_and_warns_once_without_one(monkeypatch):
    monkeypatch.setattr(plane, "_current", None)
    monkeypatch.setattr(plane, "_warned", False)
    with pytest.warns(UserWarning, match="no data plane yet"):
        wt.log(step=1, accuracy=0.5)
    model = torch.nn.Linear(3, 1)
    sync = one_rank(model)
    wt.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, sync=sync)
    wt.log(step=2, accuracy=0.75)
    assert sync.logged == [{"step": 2, "accuracy": 0.75}]


def test_connect_without_wansync_train_says_how_to_run_the_baseline(monkeypatch):
    monkeypatch.delenv("WANSYNC_CHANNEL", raising=False)
    monkeypatch.delenv("WANSYNC_BASELINE", raising=False)
    model = torch.nn.Linear(3, 1)
    with pytest.raises(RuntimeError, match=r"no WANSYNC_CHANNEL.*WANSYNC_BASELINE=gloo"):
        wt.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)


def test_the_modes_and_the_inner_optimizer_are_checked():
    model = torch.nn.Linear(3, 1)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="mode 'local'"):
        wt.Optimizer(inner, model, mode="local", sync=one_rank(model))
    with pytest.raises(ValueError, match="sync_every 0"):
        wt.Optimizer(inner, model, mode="model", sync_every=0, sync=one_rank(model))
    wrapped = wt.Optimizer(inner, model, sync=one_rank(model))
    assert wrapped.param_groups is inner.param_groups and isinstance(wrapped, torch.optim.Optimizer)
    with pytest.raises(TypeError):
        wt.Optimizer(wrapped, model, sync=one_rank(model))
    assert copy.copy(wt.ddp) is wt.ddp and callable(wt.ddp)  # the function, not the submodule


@pytest.mark.loopback
def test_importing_without_torch_gives_the_install_hint():
    blocker = textwrap.dedent("""
        import sys
        class Hide:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("No module named 'torch' (hidden)")
        sys.meta_path.insert(0, Hide())
        try:
            import wansync.torch
        except ImportError as e:
            print(e)
        else:
            print("imported")
    """)
    out = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=60)
    assert "pip install -e '.[torch]'" in out.stdout and "torch==2.13.0" in out.stdout, out.stdout + out.stderr


def test_gradients_go_in_scaled_in_one_copy_and_come_back_as_views_of_the_sum():
    """The hand-off's two ends: the world size divides in the copy in (float32 and half alike), and an
    unscaled sum becomes the float32 gradients themselves (views: no copy), a scaled one a copy."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2).to(torch.bfloat16))
    tensors = Tensors.of(model)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    flat = torch.zeros(tensors.layout.flat_size)
    tensors.grads_into(flat, 0.25)
    for i, p in enumerate(tensors.params):
        want = p.grad.float().flatten() * 0.25
        torch.testing.assert_close(tensors.param_slice(flat, i), want, atol=0, rtol=0)
    tensors.grads_from(flat, 1.0)
    lo, hi = flat.data_ptr(), flat.data_ptr() + 4 * flat.numel()
    for i, p in enumerate(tensors.params):
        inside = lo <= p.grad.data_ptr() < hi
        assert inside == (p.dtype == torch.float32), (i, p.dtype)
        torch.testing.assert_close(p.grad.float().flatten(), tensors.param_slice(flat, i), atol=1e-2, rtol=1e-2)
    tensors.grads_from(flat, 2.0)  # a weighted sum: a copy, never a scaled view of the sum
    assert all(not lo <= p.grad.data_ptr() < hi for p in tensors.params)
    torch.testing.assert_close(tensors.params[0].grad.flatten(), 2 * tensors.param_slice(flat, 0), atol=0, rtol=0)


@pytest.mark.parametrize("overflow", [False, True])
def test_the_check_trailer_folded_in_the_copy_is_the_whole_slots(overflow):
    """Grad mode's buffer written with the data plane's fold (float32 gradients scaled and folded in one pass,
    a bfloat16 one copied then scaled and folded in place, a parameter without a gradient as zeros, the
    buffers, the flag): the values are the gradients over the world size, and the fold covers every value
    and gives the trailer computed here from the finished buffer (the sketch rows bit for bit)."""
    from core import sketch
    from wansync.torch.optimizer import fill_grads

    model = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.BatchNorm1d(200),
                                torch.nn.Linear(200, 7).to(torch.bfloat16), torch.nn.Linear(7, 3))
    tensors = Tensors.of(model)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    model[3].bias.grad = None
    flat = torch.full((tensors.layout.flat_size,), 9.0)
    fold = sketch.Folder(tensors.layout.flat_size)
    fill_grads(tensors, flat, 4, overflow, None, fold)
    assert fold.covered == tensors.layout.flat_size
    for i, p in enumerate(tensors.params):
        want = torch.zeros(p.numel()) if overflow or p.grad is None else p.grad.float().flatten() / 4
        torch.testing.assert_close(tensors.param_slice(flat, i), want, atol=0, rtol=0)
    assert float(flat[tensors.layout.flag]) == (1.0 if overflow else 0.0)
    got, ref = fold.trailer(1), sketch.trailer(flat.numpy(), 1)
    assert np.array_equal(got[:sketch.ROWS], ref[:sketch.ROWS])
    assert got[sketch.ROWS] == pytest.approx(ref[sketch.ROWS], rel=1e-6)


def test_the_check_trailer_folded_in_the_parameters_copy_is_the_whole_slots():
    """Model mode's buffer (parameters: float32 folded in the copy, bfloat16 copied then folded; buffers;
    the flag) with the data plane's fold: the trailer computed here from the finished buffer."""
    from core import sketch

    model = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.BatchNorm1d(200),
                                torch.nn.Linear(200, 7).to(torch.bfloat16))
    tensors = Tensors.of(model)
    flat = torch.full((tensors.layout.flat_size,), 9.0)
    fold = sketch.Folder(tensors.layout.flat_size)
    tensors.params_into(flat, fold)
    tensors.buffers_into(flat, fold)
    tensors.flag_into(flat, 0.0, fold)
    assert fold.covered == tensors.layout.flat_size
    for i, p in enumerate(tensors.params):
        torch.testing.assert_close(tensors.param_slice(flat, i), p.detach().float().flatten(), atol=0, rtol=0)
    got, ref = fold.trailer(1), sketch.trailer(flat.numpy(), 1)
    assert np.array_equal(got[:sketch.ROWS], ref[:sketch.ROWS])
