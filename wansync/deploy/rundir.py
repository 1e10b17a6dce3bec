"""Each host's run directory (WORKDIR/runs/RUN, mode 0700): the cluster secret (0600, never on a
command line), TLS material, the computed trace, the fault scenario, and the run's options file that
the scheduler and the agent there read — the launcher's options with this directory's paths."""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path

from ..cluster import agent_options
from ..options import Options
from ..runspec import RunConfig
from .hosts import Host

SHAPING = {"app": "app", "tc": "delay-only", "none": "none"}  # deploy --shape -> what agents emulate


def host_options(cfg: RunConfig, h: Host, cluster: str, shape: str) -> Options:
    """The run's options as processes on `h` read them: every file named by its path there."""
    r = h.run_dir
    trace = f"{r}/trace.json" if cfg.trace is not None and cfg.trace.events else None
    opts = agent_options(cfg, cluster, shaping=SHAPING[shape], trace_file=None if trace is None else Path(trace),
                         secret_file=Path(f"{r}/secret"))
    values: dict[str, object] = {"output__out": f"{r}/results.jsonl", "cluster__register_timeout_s": 120.0}
    if cfg.tls is not None:
        values.update(security__tls_cert=f"{r}/tls/cert.pem", security__tls_key=f"{r}/tls/key.pem",
                      security__tls_ca=f"{r}/tls/ca.pem")
    if cfg.options.output["scenario"] is not None:
        values["output__scenario"] = f"{r}/scenario.toml"
    if cfg.options.http is not None:  # served there on a free port, forwarded here over SSH
        values["output__http"] = "127.0.0.1:0"
    if cfg.options.train["script"] is not None:  # deploy --train: the script's copies, the agent's channel
        from .training import host_train_options

        values.update(host_train_options(h, cfg.options))
    return opts.replace(**values)


async def prepare_run_dir(h: Host, cfg: RunConfig, secret: bytes, options: Options) -> None:
    r = h.run_dir
    await h.remote.run(f"umask 077 && mkdir -p {shlex.quote(r)}/tls && chmod 700 {shlex.quote(r)}",
                       what="making the run directory")
    with tempfile.TemporaryDirectory() as tmp:
        files: list[tuple[Path | bytes, str, int]] = [
            (secret, f"{r}/secret", 0o600), (options.write(Path(tmp) / "options.json").read_bytes(),
                                              f"{r}/options.json", 0o600)]
        tls = cfg.tls
        if tls is not None:
            files += [(Path(h.spec.tls_cert or tls.cert), f"{r}/tls/cert.pem", 0o644),
                      (Path(h.spec.tls_key or tls.key), f"{r}/tls/key.pem", 0o600),
                      (Path(tls.ca), f"{r}/tls/ca.pem", 0o644)]
        if cfg.trace is not None and cfg.trace.events:
            cfg.trace.write(Path(tmp) / "trace.json")
            files.append(((Path(tmp) / "trace.json").read_bytes(), f"{r}/trace.json", 0o644))
        scenario = cfg.options.output["scenario"]
        if scenario is not None:
            files.append((Path(scenario).read_bytes(), f"{r}/scenario.toml", 0o644))
        await h.remote.put(files)
