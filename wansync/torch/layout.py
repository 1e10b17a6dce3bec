"""The model as one flat float32 vector: which tensors, in which order, at which offsets.

Every rank must lay its model out the same way, or the sum of the ranks' buffers adds unrelated
numbers: `describe` gives a small msgpack-able summary a data plane can exchange, and `difference`
says in words where two ranks' models first disagree.

The flat vector is `[parameters | floating buffers | one flag]`:
- parameters: those that require grad, in `model.named_parameters()` order (shared ones once);
- floating buffers: the persistent ones (BatchNorm running stats, ...); integer buffers
  (`num_batches_tracked`) and non-persistent ones (derived constants such as masks) stay local;
- the flag: one float the optimizer uses to agree on skipping a step (a GradScaler overflow on some
  rank); always 0 otherwise.

Parameters may be float32, float16 or bfloat16: they are synchronized in float32 and cast back.
Anything else (float64, complex, integer parameters; sparse gradients) is refused with the name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from core.sketch import Folder

DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


@dataclass(frozen=True)
class Spec:
    """One tensor of the layout: its name, shape, dtype (a name such as "float32") and offset."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Layout:
    """The ordered tensors of a model and where each lies in the flat vector."""

    params: tuple[Spec, ...]
    buffers: tuple[Spec, ...]

    @property
    def param_numel(self) -> int:
        return sum(s.numel for s in self.params)

    @property
    def buffer_numel(self) -> int:
        return sum(s.numel for s in self.buffers)

    @property
    def numel(self) -> int:
        """Elements of parameters and floating buffers (the model's state that is synchronized)."""
        return self.param_numel + self.buffer_numel

    @property
    def flat_size(self) -> int:
        """Length of the Sync's flat buffer: the model's elements and the skip flag."""
        return self.numel + 1

    @property
    def flag(self) -> int:
        """Offset of the skip flag."""
        return self.numel


class Tensors:
    """A model's live tensors bound to their layout: copies between them and a flat float32 vector,
    view by view (no concatenated copy of the model is ever made)."""

    def __init__(self, params: Sequence[tuple[str, torch.Tensor]], buffers: Sequence[tuple[str, torch.Tensor]]) -> None:
        specs, offset = [], 0
        for name, p in params:
            _check_dtype(p, f"parameter {name!r}")
            specs.append(Spec(name, tuple(p.shape), DTYPES[p.dtype], offset))
            offset += p.numel()
        bspecs = []
        for name, b in buffers:
            _check_dtype(b, f"buffer {name!r}")
            bspecs.append(Spec(name, tuple(b.shape), DTYPES[b.dtype], offset))
            offset += b.numel()
        self.layout = Layout(tuple(specs), tuple(bspecs))
        self.params = [p for _, p in params]
        self.buffers = [b for _, b in buffers]

    @classmethod
    def of(cls, model: torch.nn.Module | None, params: Iterable[torch.Tensor] = ()) -> Tensors:
        """The model's trainable parameters and persistent floating buffers; without a model, the
        given parameters (named "param.<i>") and no buffers."""
        if model is None:
            seen: dict[int, torch.Tensor] = {}
            for p in params:
                if p.requires_grad:
                    seen.setdefault(id(p), p)
            return cls([(f"param.{i}", p) for i, p in enumerate(seen.values())], [])
        _refuse_sparse_modules(model)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        return cls(named, [(n, b) for n, b in _persistent_buffers(model) if b.is_floating_point()])

    def _views(self, flat: torch.Tensor, tensors: list[torch.Tensor], specs: tuple[Spec, ...]) -> Iterable:
        for t, s in zip(tensors, specs, strict=True):
            yield t, flat[s.offset : s.offset + s.numel].view(s.shape), s

    # parameters and gradients
    def params_into(self, flat: torch.Tensor, fold: Folder | None = None) -> None:
        """The parameters into the flat vector (float32); `fold`: the check trailer, folded in the copy."""
        for p, v, s in self._views(flat, self.params, self.layout.params):
            if fold is not None:
                copy_folded(v, p.detach(), 1.0, s.offset, fold)
            else:
                v.copy_(p.detach())

    def grads_into(self, flat: torch.Tensor, scale: float = 1.0, fold: Folder | None = None) -> None:
        """Gradients times `scale` into the flat vector, in the copy's one pass (as DDP divides by the world
        size before its all-reduce); a parameter without a gradient contributes zeros. `fold`: the
        data plane's check trailer, folded in that same pass (core.sketch.Folder)."""
        for p, v, s in self._views(flat, self.params, self.layout.params):
            if p.grad is None:
                v.zero_()
                if fold is not None:
                    fold.zeros(v.numel())
                continue
            if p.grad.is_sparse:
                raise ValueError(f"parameter {s.name!r} has a sparse gradient: wansync.torch syncs dense ones only")
            if fold is not None:
                copy_folded(v, p.grad, scale, s.offset, fold)
            elif scale != 1.0 and p.grad.dtype == v.dtype and p.grad.device == v.device:
                torch.mul(p.grad, scale, out=v)
            else:  # another dtype or device: scaled in float32, on this side of the copy
                v.copy_(p.grad)
                if scale != 1.0:
                    v.mul_(scale)

    def params_from(self, flat: torch.Tensor, scale: float = 1.0) -> None:
        with torch.no_grad():
            for p, v, _ in self._views(flat, self.params, self.layout.params):
                _scaled_into(p, v, scale)

    def grads_from(self, flat: torch.Tensor, scale: float = 1.0) -> None:
        """Gradients from the flat vector; every parameter gets one (zeros where no rank had any, as
        DDP gives unused parameters). Unscaled, a float32 parameter on the flat vector's device gets a view
        of it as its gradient, not a copy: the step reads the sum where the data plane left it (valid
        until the next synchronization, as the gradients are until the next backward pass)."""
        for p, v, _ in self._views(flat, self.params, self.layout.params):
            if scale == 1.0 and p.dtype == v.dtype and p.device == v.device:
                p.grad = v
                continue
            if p.grad is None or _shares_memory(p.grad, flat):  # a view of the last sum: a gradient of its own now
                p.grad = torch.empty_like(p)
            _scaled_into(p.grad, v, scale)

    # floating buffers (BatchNorm running statistics)
    def buffers_into(self, flat: torch.Tensor, fold: Folder | None = None) -> None:
        for b, v, s in self._views(flat, self.buffers, self.layout.buffers):
            v.copy_(b)
            if fold is not None:
                fold.add(v.view(-1).numpy(), s.offset)

    def flag_into(self, flat: torch.Tensor, value: float, fold: Folder | None = None) -> None:
        """The skip flag (1.0: this rank's step is to be skipped everywhere), folded where there is a fold."""
        at = self.layout.flag
        flat[at] = value
        if fold is not None:
            fold.add(flat[at:at + 1].numpy(), at)

    def buffers_from(self, flat: torch.Tensor, scale: float = 1.0) -> None:
        with torch.no_grad():
            for b, v, _ in self._views(flat, self.buffers, self.layout.buffers):
                _scaled_into(b, v, scale)

    def param_slice(self, flat: torch.Tensor, index: int) -> torch.Tensor:
        s = self.layout.params[index]
        return flat[s.offset : s.offset + s.numel]


def copy_folded(dst: torch.Tensor, src: torch.Tensor, scale: float, offset: int, fold: Folder) -> None:
    """dst (a piece of a CPU flat vector, at `offset`) = src * scale, folded into the check trailer: in the
    copy's one pass where src is a CPU float32 tensor in one piece, else copied first (another dtype or
    device), then scaled and folded in place."""
    d = dst.view(-1).numpy()
    if src.dtype == torch.float32 and src.device.type == "cpu" and src.is_contiguous():
        fold.scaled_copy(src.reshape(-1).numpy(), d, scale, offset)
        return
    dst.copy_(src)
    if scale == 1.0:
        fold.add(d, offset)
    else:
        fold.scaled_copy(d, d, scale, offset)


def _scaled_into(dst: torch.Tensor, src: torch.Tensor, scale: float) -> None:
    """dst = src * scale in one pass where the dtypes and devices agree (no temporary the model's size)."""
    if scale == 1.0:
        dst.copy_(src)
    elif dst.dtype == src.dtype and dst.device == src.device:
        torch.mul(src, scale, out=dst)
    else:
        dst.copy_(src * scale)


def _shares_memory(t: torch.Tensor, flat: torch.Tensor) -> bool:
    return t.device == flat.device and t.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()


def _check_dtype(t: torch.Tensor, what: str) -> None:
    if t.dtype not in DTYPES:
        raise ValueError(
            f"{what} is {str(t.dtype).removeprefix('torch.')}: wansync.torch syncs float32, float16 and bfloat16 "
            "tensors only (float16/bfloat16 are synchronized in float32 and cast back)"
        )
    if t.is_sparse:
        raise ValueError(f"{what} is sparse: wansync.torch syncs dense tensors only")


def _refuse_sparse_modules(model: torch.nn.Module) -> None:
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Embedding | torch.nn.EmbeddingBag) and m.sparse:
            raise ValueError(
                f"module {name!r} makes sparse gradients (sparse=True): wansync.torch syncs dense ones only"
            )


def _persistent_buffers(model: torch.nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    seen: set[int] = set()
    for mname, m in model.named_modules():
        for bname, b in m._buffers.items():
            if b is None or bname in m._non_persistent_buffers_set or id(b) in seen:
                continue
            seen.add(id(b))
            yield (f"{mname}.{bname}" if mname else bname), b


def describe(layout: Layout) -> dict[str, Any]:
    """A small msgpack-able summary: per tensor [name, shape, dtype], for parameters and buffers."""
    return {
        "params": [[s.name, list(s.shape), s.dtype] for s in layout.params],
        "buffers": [[s.name, list(s.shape), s.dtype] for s in layout.buffers],
    }


def difference(a: Layout | dict[str, Any], b: Layout | dict[str, Any]) -> str | None:
    """The first difference between two layouts (here `a`, there `b`) in words, or None if they agree."""
    da = describe(a) if isinstance(a, Layout) else a
    db = describe(b) if isinstance(b, Layout) else b
    for kind, noun in (("params", "tensor"), ("buffers", "buffer")):
        xs, ys = list(da.get(kind, [])), list(db.get(kind, []))
        for i, (x, y) in enumerate(zip(xs, ys, strict=False)):
            (nx, sx, tx), (ny, sy, ty) = x, y
            if nx != ny:
                return f"{noun} {i}: {nx!r} here, {ny!r} there"
            if list(sx) != list(sy):
                return f"{noun} {i} {nx!r}: shape {list(sx)} here, {list(sy)} there"
            if tx != ty:
                return f"{noun} {i} {nx!r}: dtype {tx} here, {ty} there"
        if len(xs) != len(ys):
            what = "parameters" if kind == "params" else "floating buffers"
            return f"{len(xs)} {what} here, {len(ys)} there"
    return None
