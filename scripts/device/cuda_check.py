"""The device check of wansync.torch with CUDA tensors: `wansync train` runs a two-rank script whose
model lives on the GPU (grad mode through wt.Optimizer, then wt.ddp), and this compares every rank's
final parameters with a reference computed here on the GPU (rank 0's start, the ranks' gradients
averaged, SGD). Prints one line per mode and, last, a JSON line."""

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


def reference() -> dict[str, torch.Tensor]:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for k in range(5):
        grads = []
        for rank in range(2):
            g = torch.Generator().manual_seed(100 * rank + k)
            x, y = torch.randn(16, 32, generator=g).to(dev), torch.randint(0, 4, (16,), generator=g).to(dev)
            model.zero_grad()
            F.cross_entropy(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, a, b in zip(model.parameters(), *grads, strict=True):
            p.grad = (a + b) / 2
        opt.step()
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def main() -> None:
    print(f"torch {torch.__version__}, cuda {torch.cuda.is_available()}, {torch.cuda.get_device_name(0)}", flush=True)
    ref = reference()
    out = Path(tempfile.mkdtemp())
    figures = {}
    for mode in ("grad", "ddp"):
        p = subprocess.run([sys.executable, "-m", "wansync.cli", "train", str(PROBE), str(out), mode, "--nodes", "2",
                            "--topology", "uniform:1000", "--schemes", "ring", "--no-http"],
                           cwd=ROOT, capture_output=True, text=True, timeout=240,
                           env={**os.environ, "COLUMNS": "160"})
        if p.returncode != 0:
            print(f"{mode}: wansync train failed ({p.returncode}):\n{p.stderr[-3000:]}", flush=True)
            figures[mode] = None
            continue
        worst = 0.0
        for rank in range(2):
            got = torch.load(out / f"{mode}-r{rank}.pt")
            worst = max(worst, max(float((got[k] - ref[k]).abs().max()) for k in ref))
        print(f"{mode}: max |rank - reference| = {worst:.3g} over both ranks", flush=True)
        figures[mode] = worst
    print(json.dumps({"cuda_grad_max_abs_diff": figures["grad"], "cuda_ddp_max_abs_diff": figures["ddp"],
                      "ok": all(v is not None and v < 1e-5 for v in figures.values())}))


if __name__ == "__main__":
    main()
