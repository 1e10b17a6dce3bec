"""`wt.Optimizer`: the user's torch optimizer, synchronized across ranks through a data plane.

Three modes, one flat float32 buffer (see layout.py):
- `grad`: every step averages the gradients, then the inner optimizer steps (DDP's math; several
  backward passes before a step accumulate as usual). As DDP does, each rank's gradients are divided by
  the world size as they are copied into the flat buffer; the mean comes back as the float32 gradients
  themselves (`p.grad` becomes a view of the data plane's result, valid until the next step);
- `model`: the inner optimizer steps locally; every `sync_every` steps the parameters are averaged
  (local SGD; with a partial-reduce data plane, the scheduler's weights);
- `outer`: DiLoCo. Every `sync_every` (H) inner steps the pseudo-gradient (outer params - params) is
  averaged and an outer SGD (lr 0.7, momentum 0.9, Nesterov) steps the outer params, which every
  rank then continues from.

Floating buffers (BatchNorm running statistics): rank 0's are broadcast with the parameters when
the optimizer is made; afterwards they are averaged at every synchronization (every step in `grad`
mode, where DDP would broadcast rank 0's; with the model in `model` and `outer` modes).

float16/bfloat16 parameters are synchronized in float32 and cast back; `outer` mode keeps its
outer parameters in float32. A non-finite contribution makes the data plane raise `SyncError`
naming the rank; it is not caught here.

With `torch.amp.GradScaler`, `scaler.step(opt)` hands the step to this optimizer
(`_step_supports_amp_scaling`), which unscales the gradients itself. In `grad` mode the ranks agree
through the buffer's flag whether any overflowed: then every rank skips the step, as under DDP
(each rank's scaler still backs off only on its own overflow; the scales may differ for a few steps,
which changes nothing since each rank unscales its own gradients). In `model`/`outer` modes an
overflow skips only that rank's inner step; synchronizations stay on schedule.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from core.sketch import Folder

from . import modes
from .layout import Tensors
from .replica import broadcast, open_sync
from .sync import Sync, SyncError

MODES = ("grad", "model", "outer")


class Optimizer(torch.optim.Optimizer):
    """Wraps `inner` (its param_groups are this optimizer's, so LR schedulers work on either)."""

    _step_supports_amp_scaling = True  # GradScaler: step() unscales and skips on overflow itself

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        model: torch.nn.Module | None = None,
        *,
        mode: str = "grad",
        sync_every: int = 1,
        outer_lr: float = 0.7,
        outer_momentum: float = 0.9,
        nesterov: bool = True,
        sync: Sync | None = None,
    ) -> None:
        if not isinstance(inner, torch.optim.Optimizer) or isinstance(inner, Optimizer):
            raise TypeError(f"inner must be a torch optimizer (not a wansync one), got {type(inner).__name__}")
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
        if sync_every < 1:
            raise ValueError(f"sync_every {sync_every}: at least 1")
        if (why := modes.from_env(mode)) is not None:  # before attaching: the launcher shows why
            raise SyncError(why)
        # What torch.optim.Optimizer.__init__ sets, less the param groups, which stay inner's.
        self.inner = inner
        for hooks in ("step_pre", "step_post", "state_dict_pre", "state_dict_post", "load_state_dict_pre",
                      "load_state_dict_post"):
            setattr(self, f"_optimizer_{hooks}_hooks", OrderedDict())
        self._patch_step_function()
        self._warned_capturable_if_run_uncaptured = True

        self.mode, self.sync_every = mode, sync_every
        params = [p for g in inner.param_groups for p in g["params"]]
        self.tensors = Tensors.of(model, params)
        self.sync = open_sync(self.tensors, sync)
        broadcast(self.sync, self.tensors)
        self.steps = 0
        self.outer_params: list[torch.Tensor] = []
        self.outer: torch.optim.SGD | None = None
        if mode == "outer":
            self.outer_params = [p.detach().to(torch.float32, copy=True) for p in self.tensors.params]
            self.outer = torch.optim.SGD(self.outer_params, lr=outer_lr, momentum=outer_momentum, nesterov=nesterov)

    # torch.optim.Optimizer's attributes, shared with inner
    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.inner.param_groups

    @param_groups.setter
    def param_groups(self, groups: list[dict[str, Any]]) -> None:
        self.inner.param_groups = groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.inner.state

    @state.setter
    def state(self, state: Any) -> None:
        self.inner.state = state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.inner.defaults

    @defaults.setter
    def defaults(self, defaults: dict[str, Any]) -> None:
        self.inner.defaults = defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise NotImplementedError("the synchronized layout is fixed when wt.Optimizer is made; add groups before")

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        overflow, scale = _amp(self)
        if self.mode == "grad":
            self._grad_step(overflow, scale)
        else:
            if not overflow:
                if scale is not None:
                    for p in self.tensors.params:
                        if p.grad is not None:
                            p.grad.div_(scale)
                self.inner.step()
            self.steps += 1
            if self.steps % self.sync_every == 0:
                self._model_sync() if self.mode == "model" else self._outer_sync()
            return loss
        self.steps += 1
        return loss

    def _grad_step(self, overflow: bool, scale: torch.Tensor | None) -> None:
        layout, flat = self.tensors.layout, self.sync.buffer()
        fill_grads(self.tensors, flat, self.sync.world, overflow, scale, self.sync.folder())
        reduced = self.sync.allreduce()
        if len(reduced.members) != self.sync.world:
            raise SyncError(f"rank {self.sync.rank}: grad mode got the gradients of ranks {list(reduced.members)} "
                            f"of {self.sync.world}; it needs every rank's at every step "
                            f"({modes.WHY[('grad', 'partial')]})")
        if float(reduced.result[layout.flag]) > 0:
            return  # some rank overflowed: every rank skips this step
        self.tensors.grads_from(reduced.result, self.sync.world / reduced.weight)  # 1 for a plain sum: views
        self.tensors.buffers_from(reduced.result, 1.0 / reduced.weight)
        self.inner.step()

    def _model_sync(self) -> None:
        flat, fold = self.sync.buffer(), self.sync.folder()
        self.tensors.params_into(flat, fold)
        self.tensors.buffers_into(flat, fold)
        self.tensors.flag_into(flat, 0.0, fold)
        reduced = self.sync.allreduce()
        self.tensors.params_from(reduced.result, 1.0 / reduced.weight)
        self.tensors.buffers_from(reduced.result, 1.0 / reduced.weight)

    def _outer_sync(self) -> None:
        """Average the pseudo-gradients, then step the outer params and continue from them."""
        assert self.outer is not None
        flat, tensors, fold = self.sync.buffer(), self.tensors, self.sync.folder()
        for i, (p, q) in enumerate(zip(tensors.params, self.outer_params, strict=True)):
            part = tensors.param_slice(flat, i)
            if q.device == part.device:
                torch.sub(q, p.to(torch.float32), out=part.view(q.shape))
            else:  # on another device: the difference there, then one copy
                part.view(q.shape).copy_(q - p.to(torch.float32))
            if fold is not None:
                fold.add(part.numpy(), tensors.layout.params[i].offset)
        tensors.buffers_into(flat, fold)
        tensors.flag_into(flat, 0.0, fold)
        reduced = self.sync.allreduce()
        w = 1.0 / reduced.weight
        for i, q in enumerate(self.outer_params):
            q.grad = tensors.param_slice(reduced.result, i).view(q.shape).to(q.device) * w
        self.outer.step()
        for p, q in zip(tensors.params, self.outer_params, strict=True):
            p.copy_(q)
            q.grad = None
        tensors.buffers_from(reduced.result, w)

    def state_dict(self) -> dict[str, Any]:
        """Inner's state, plus this wrapper's: mode, step count, and in `outer` mode the outer params
        and the outer optimizer's momentum."""
        mine: dict[str, Any] = {"mode": self.mode, "steps": self.steps}
        if self.outer is not None:
            mine["outer_params"] = [q.clone() for q in self.outer_params]
            mine["outer"] = self.outer.state_dict()
        return {"inner": self.inner.state_dict(), "wansync": mine}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        mine = state_dict["wansync"]
        if mine["mode"] != self.mode:
            raise ValueError(f"state of a {mine['mode']!r}-mode optimizer loaded into a {self.mode!r}-mode one")
        self.inner.load_state_dict(state_dict["inner"])
        self.steps = int(mine["steps"])
        if self.outer is not None:
            for q, saved in zip(self.outer_params, mine["outer_params"], strict=True):
                q.copy_(saved)
            self.outer.load_state_dict(mine["outer"])

    def close(self) -> None:
        """Detach from the data plane (no more synchronizations from this rank)."""
        self.sync.close()


def fill_grads(tensors: Tensors, flat: torch.Tensor, world: int, overflow: bool, scale: torch.Tensor | None,
               fold: Folder | None) -> None:
    """Grad mode's buffer: the gradients divided by the world size (and the AMP scale) in the copy, so the
    sum is the mean (zeros where this rank overflowed), the floating buffers, the skip flag; each piece
    folded into the data plane's check trailer as it is written (`fold`, where the data plane has one)."""
    layout = tensors.layout
    if overflow:
        flat[: layout.param_numel].zero_()
        if fold is not None:
            fold.zeros(layout.param_numel)
    else:
        tensors.grads_into(flat, 1.0 / (world * (1.0 if scale is None else float(scale))), fold)
    tensors.buffers_into(flat, fold)
    tensors.flag_into(flat, 1.0 if overflow else 0.0, fold)


def _amp(opt: torch.optim.Optimizer) -> tuple[bool, torch.Tensor | None]:
    """What GradScaler set on the optimizer for this step: whether this rank's gradients overflowed,
    and the scale they still carry (None if unscaled or no scaler)."""
    found = getattr(opt, "found_inf", None)
    scale = getattr(opt, "grad_scale", None)
    return (found is not None and float(found) > 0), scale
