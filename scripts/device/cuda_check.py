"""The device check of wansync.torch with CUDA tensors: `wansync train` runs a two-rank script whose
model lives on the GPU, once per mode (grad and model averaging and DiLoCo's outer step through
wt.Optimizer, wt.ddp, and a bfloat16 model in grad mode), through real agents; this compares every
rank's final parameters with a reference it computes itself on the same device (rank 0's start, each
rank's own batches, the mode's averaging done here with plain tensors). Prints one line per mode and,
last, a JSON line. WANSYNC_CHECK_DEVICE=cpu runs the same check without a GPU (to try it first)."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "scripts" / "device" / "torch_cuda_probe.py"
STEPS, SYNC_EVERY, LR, WORLD = 6, 2, 0.1, 2
MODES = ("grad", "ddp", "model", "outer", "bf16")
TOL = {"bf16": 8e-3}  # bfloat16 parameters: its own rounding (8 bits of mantissa) bounds the agreement
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9  # wt.Optimizer's DiLoCo defaults (Nesterov)


def device() -> torch.device:
    return torch.device(os.environ.get("WANSYNC_CHECK_DEVICE", "cuda"))


def make_model(seed: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dtype)


def batch(rank: int, step: int, dev: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(16, 32, generator=g).to(dev, dtype), torch.randint(0, 4, (16,), generator=g).to(dev)


def _grads(model: torch.nn.Module, rank: int, step: int) -> list[torch.Tensor]:
    dtype = next(model.parameters()).dtype
    x, y = batch(rank, step, device(), dtype)
    model.zero_grad()
    F.cross_entropy(model(x).float(), y).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


@torch.no_grad()
def _average(models: list[torch.nn.Module]) -> list[torch.Tensor]:
    return [torch.stack([p.float() for p in ps]).mean(0) for ps in zip(*(m.parameters() for m in models), strict=True)]


def reference(mode: str) -> dict[str, torch.Tensor]:
    """What every rank must hold after STEPS steps of `mode`, computed here: rank 0's initial model,
    each rank's batches, and the averaging of the mode, on plain tensors."""
    dev = device()
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    start = make_model(seed=0, dtype=dtype).to(dev)
    if mode in ("grad", "ddp", "bf16"):  # DDP's math: the ranks' gradients averaged, one SGD step
        model = start
        for k in range(STEPS):
            grads = [_grads(model, r, k) for r in range(WORLD)]
            with torch.no_grad():
                for p, *gs in zip(model.parameters(), *grads, strict=True):
                    avg = torch.stack([g.float() for g in gs]).mean(0)
                    p.copy_((p.float() - LR * avg).to(p.dtype))
        return {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    models = [make_model(seed=0).to(dev) for _ in range(WORLD)]
    for m in models:
        m.load_state_dict(start.state_dict())
    outer = [p.detach().clone() for p in start.parameters()]
    momentum = [torch.zeros_like(p) for p in outer]
    for k in range(STEPS):
        for r, m in enumerate(models):  # each rank's own SGD step
            grads = _grads(m, r, k)
            with torch.no_grad():
                for p, g in zip(m.parameters(), grads, strict=True):
                    p.sub_(LR * g)
        if (k + 1) % SYNC_EVERY:
            continue
        avg = _average(models)
        if mode == "outer":  # Nesterov SGD on the averaged pseudo-gradient (torch.optim.SGD's rule)
            for q, a, b in zip(outer, avg, momentum, strict=True):
                grad = q - a
                b.mul_(OUTER_MOMENTUM).add_(grad)
                q.sub_(OUTER_LR * (grad + OUTER_MOMENTUM * b))
            avg = outer
        with torch.no_grad():
            for m in models:
                for p, a in zip(m.parameters(), avg, strict=True):
                    p.copy_(a)
    return {k: v.detach().float().cpu() for k, v in models[0].state_dict().items()}


def main() -> None:
    dev = device()
    name = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"
    print(f"torch {torch.__version__}, device {dev} ({name})", flush=True)
    out = Path(tempfile.mkdtemp())
    figures: dict[str, float | None] = {}
    for mode in MODES:
        ref = reference(mode)
        p = subprocess.run([sys.executable, "-m", "wansync.cli", "train", str(PROBE), str(out), mode, "--nodes",
                            str(WORLD), "--topology", "uniform:1000", "--schemes", "ring", "--no-http"],
                           cwd=ROOT, capture_output=True, text=True, timeout=240,
                           env={**os.environ, "COLUMNS": "160"})
        if p.returncode != 0:
            print(f"{mode}: wansync train failed ({p.returncode}):\n{p.stderr[-3000:]}", flush=True)
            figures[mode] = None
            continue
        worst = 0.0
        for rank in range(WORLD):
            got = torch.load(out / f"{mode}-r{rank}.pt")
            worst = max(worst, max(float((got[k] - ref[k]).abs().max()) for k in ref))
        print(f"{mode}: max |rank - reference| = {worst:.3g} over {WORLD} ranks (tolerance {TOL.get(mode, 1e-5)})",
              flush=True)
        figures[mode] = worst
    print(json.dumps({**{f"{dev.type}_{m}_max_abs_diff": v for m, v in figures.items()},
                      "ok": all(v is not None and v <= TOL.get(m, 1e-5) for m, v in figures.items())}))


if __name__ == "__main__":
    main()
