"""Data-parallel training of an MLP on scikit-learn's digits, each rank on its own shard (RANK, WORLD_SIZE).

train_digits.py runs under `wansync train`; train_digits_plain.py, its plain-torch twin, differs only
in the lines marked `# wansync` (docs/training.md).
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits


p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=300)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--hidden", type=int, default=256)
p.add_argument("--eval-every", type=int, default=20)
p.add_argument("--pace", type=float, default=0.0, help="a step computes at least this long (a slower device)")
p.add_argument("--mode", default="grad")
p.add_argument("--sync-every", type=int, default=1)
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()

torch.set_num_threads(1)
torch.manual_seed(args.seed)
rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
X, y = load_digits(return_X_y=True)
X, y = torch.tensor(X / 16, dtype=torch.float32), torch.tensor(y)
g = torch.Generator().manual_seed(args.seed)
perm = torch.randperm(len(y), generator=g)
test, mine = perm[:360], perm[360:][rank::world]

h = args.hidden
model = torch.nn.Sequential(torch.nn.Linear(64, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(),
                            torch.nn.Linear(h, 10))
opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
eval_s = 0.0
for step in range(args.steps):
    t = time.perf_counter()
    idx = mine[torch.randint(len(mine), (args.batch,), generator=g)]
    loss = F.cross_entropy(model(X[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    time.sleep(max(0.0, args.pace - (time.perf_counter() - t)))
    opt.step()
    if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
        t = time.perf_counter()
        with torch.no_grad():
            acc = (model(X[test]).argmax(1) == y[test]).float().mean().item()
        eval_s += time.perf_counter() - t
        print(f"step {step + 1} accuracy {acc:.3f} loss {loss.item():.3f} eval_s {eval_s:.2f}")
