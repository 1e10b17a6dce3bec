"""The mode x progress table (wansync/torch/modes.py, docs/training-progress.md): what is refused and
why, before the first sync and, in grad mode, at a sync whose group is not every rank."""

import pytest
import torch

from wansync.torch import modes

pytestmark = [pytest.mark.unit, pytest.mark.torch]


@pytest.mark.parametrize("mode", ["grad", "model", "outer"])
@pytest.mark.parametrize("groups", ["full", "partial", "multicast"])
def test_only_model_mode_trains_over_partial_and_multicast_groups(mode, groups):
    why = modes.refusal(mode, groups, "queue")
    assert (why is None) == (mode == "model" or groups == "full")
    if why is not None:
        assert why.startswith(f"mode {mode!r} under --progress queue: ") and "mode='model'" in why


def test_the_optimizer_refuses_a_pair_before_attaching(monkeypatch):
    import wansync.torch as wt

    monkeypatch.setenv(modes.GROUPS_ENV, "partial")
    monkeypatch.setenv(modes.PROGRESS_ENV, "crew")
    model = torch.nn.Linear(2, 1)
    with pytest.raises(wt.SyncError, match="mode 'outer' under --progress crew: outer mode"):
        wt.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, mode="outer")


class Partial:
    """A data plane whose syncs after the first hold only ranks 0 and 1 of 3."""

    rank, world = 0, 3

    def __init__(self, params: int) -> None:
        self.params = params
        self.flat = torch.zeros(params)
        self.calls = 0

    def buffer(self) -> torch.Tensor:
        return self.flat

    def folder(self):
        return None

    def allreduce(self):
        import wansync.torch as wt

        self.calls += 1
        members = (0, 1, 2) if self.calls == 1 else (0, 1)
        return wt.Reduced(self.flat.clone() * len(members), float(len(members)), members)

    def log(self, **metrics: float) -> None:
        pass

    def close(self) -> None:
        pass


def test_grad_mode_fails_a_sync_that_did_not_hold_every_rank():
    import wansync.torch as wt
    from wansync.torch.layout import Tensors

    model = torch.nn.Linear(2, 1)
    opt = wt.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model,
                       sync=Partial(Tensors.of(model).layout.flat_size))
    model(torch.ones(1, 2)).sum().backward()
    with pytest.raises(wt.SyncError, match=r"grad mode got the gradients of ranks \[0, 1\] of 3"):
        opt.step()
