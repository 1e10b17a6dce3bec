"""Real torch ranks for the wansync.torch tests: `ranks(scenario, world, tmp)` starts `world` processes
of this file with torchrun's environment (Gloo on 127.0.0.1), each runs one scenario and saves what
the test compares into tmp/<rank>.pt. The model and data are functions here so that a test can
recompute, in one process, what the ranks should have reached."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

STEPS = 5
LR = 0.1


def make_model(seed: int, bn: bool = False) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = [torch.nn.Linear(8, 16)]
    if bn:
        layers.append(torch.nn.BatchNorm1d(16))
    layers += [torch.nn.ReLU(), torch.nn.Linear(16, 4)]
    return torch.nn.Sequential(*layers)


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)


def loss_of(model: torch.nn.Module, rank: int, step: int) -> torch.Tensor:
    x, y = batch(rank, step)
    return torch.nn.functional.cross_entropy(model(x), y)


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks(scenario: str, world: int, tmp: Path, timeout: float = 90) -> list[dict]:
    """Run the scenario on `world` ranks; every rank's saved dict, in rank order."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo",
               "OMP_NUM_THREADS": "1", "WANSYNC_BASELINE": "gloo", "WANSYNC_METRICS": str(tmp / "metrics.jsonl")}
        env.pop("WANSYNC_CHANNEL", None)
        procs.append(subprocess.Popen([sys.executable, __file__, scenario, str(tmp)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, out) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"rank {rank} of {scenario!r} exited {p.returncode}:\n{out[-3000:]}"
    return [torch.load(tmp / f"{rank}.pt") for rank in range(world)]


# ---- the scenarios, run in the rank processes -------------------------------------------------

def _ddp_reference(rank: int, bn: bool = False, scaler_inf: bool = False) -> dict[str, torch.Tensor]:
    """Plain DDP (no hook) from this rank's own init: rank 0's model after construction."""
    from torch.nn.parallel import DistributedDataParallel

    model = make_model(seed=rank, bn=bn)
    wrapped = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10) if scaler_inf else None
    for step in range(STEPS):
        opt.zero_grad()
        loss = loss_of(wrapped, rank, step)
        if scaler is not None:
            if rank == 1 and step == 2:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
    return params(model)


def scenario_grad(rank: int) -> dict:
    import wansync.torch as wt

    model = make_model(seed=rank, bn=True)
    model[1].running_mean.fill_(float(rank + 1))  # buffers differ too before the broadcast
    before = params(model)
    opt = wt.Optimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9), model)
    attached = params(model)
    for step in range(STEPS):
        opt.zero_grad()
        loss_of(model, rank, step).backward()
        opt.step()
        wt.log(step=step, loss=1.5)
    return {"before": before, "attached": attached, "final": params(model), "reference": _ddp_reference(rank, bn=True)}


def scenario_scaler(rank: int) -> dict:
    import wansync.torch as wt

    model = make_model(seed=rank)
    opt = wt.Optimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9), model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    skipped = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = loss_of(model, rank, step)
        if rank == 1 and step == 2:
            loss = loss * float("inf")
        before = params(model)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        skipped.append(all(torch.equal(before[k], v) for k, v in params(model).items()))
    return {"final": params(model), "skipped": skipped, "reference": _ddp_reference(rank, scaler_inf=True)}


def scenario_ddp(rank: int) -> dict:
    import wansync.torch as wt
    from core import sketch
    from wansync.torch.gloo import GlooSync
    from wansync.torch.layout import Tensors

    class Counted(GlooSync):
        """Gloo's sum, with a check trailer to fold as a wansync channel has (wt.ddp's hook folds it in
        its copy): at every sync the fold must cover the whole buffer and give the trailer computed here
        from the buffer as it is sent (the sketch rows bit for bit), overflowing step included."""

        calls = 0
        bad_folds = 0

        def folder(self) -> sketch.Folder:
            self.fold = sketch.Folder(self.params)
            return self.fold

        def allreduce(self) -> wt.Reduced:
            Counted.calls += 1
            want = sketch.trailer(self.buffer().numpy(), 1)
            got = self.fold.trailer(1)
            if self.fold.covered != self.params or not (got[:sketch.ROWS] == want[:sketch.ROWS]).all():
                Counted.bad_folds += 1
            return super().allreduce()

    model = make_model(seed=rank)
    wrapped = wt.ddp(model, sync=Counted(Tensors.of(model).layout.flat_size))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    for step in range(STEPS):
        opt.zero_grad()
        loss = loss_of(wrapped, rank, step)
        if rank == 1 and step == 2:  # an overflow on one rank: every rank's scaler must skip the step
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    reference = _ddp_reference(rank, scaler_inf=True)
    return {"final": params(model), "reference": reference, "syncs": Counted.calls, "scale": scaler.get_scale(),
            "bad_folds": Counted.bad_folds}


def _local(mode: str, rank: int) -> dict:
    import wansync.torch as wt

    model = make_model(seed=rank)
    opt = wt.Optimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9), model, mode=mode, sync_every=2)
    for step in range(STEPS):
        opt.zero_grad()
        loss_of(model, rank, step).backward()
        opt.step()
    return {"final": params(model)}


def scenario_model(rank: int) -> dict:
    return _local("model", rank)


def scenario_outer(rank: int) -> dict:
    return _local("outer", rank)


def scenario_nonfinite(rank: int) -> dict:
    import wansync.torch as wt

    model = make_model(seed=rank)
    opt = wt.Optimizer(torch.optim.SGD(model.parameters(), lr=LR), model)
    loss = loss_of(model, rank, 0)
    (loss * float("nan") if rank == 1 else loss).backward()
    try:
        opt.step()
    except wt.SyncError as e:
        return {"error": str(e)}
    return {"error": None}


def main() -> None:
    scenario, tmp = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    result = globals()[f"scenario_{scenario}"](rank)
    torch.save(result, tmp / f"{rank}.pt")
    import torch.distributed as dist

    if dist.is_initialized():
        # every rank is done with the group before any tears it down: a peer's Gloo pair closed under a
        # rank still reading from it aborted that rank ("terminate called without an active exception")
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
