"""A rank of the CUDA check (scripts/device/cuda_check.py): a model on the GPU, five grad-mode steps
through wansync.torch, its final parameters saved for the checker to compare with its own reference."""

import os
import sys

import torch
import torch.nn.functional as F

import wansync.torch as wt

out, mode = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
dev = torch.device("cuda")
torch.manual_seed(rank)  # different on purpose: the broadcast at attach must make rank 0's the start
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dev)
if mode == "ddp":
    model = wt.ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
else:
    opt = wt.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
for k in range(5):
    g = torch.Generator().manual_seed(100 * rank + k)
    x, y = torch.randn(16, 32, generator=g).to(dev), torch.randint(0, 4, (16,), generator=g).to(dev)
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
state = (model.module if mode == "ddp" else model).state_dict()
torch.save({k: v.detach().cpu() for k, v in state.items()}, f"{out}/{mode}-r{rank}.pt")
