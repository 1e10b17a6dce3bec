"""Which machine an agent runs on, and the CPUs it may use: what it tells the scheduler at REGISTER.

Agents that report one machine share its cores, so the scheduler can keep a plan's chunk handling
within them (scheduler/planners/cpufit.py): a local cluster, or several agents per host over SSH. The
id is the machine's own (systemd's /etc/machine-id, else the kernel's boot id), hashed: it says only
"the same machine as", and network namespaces (the tc backend) do not change it.
"""

from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path

ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id", "/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class Machine:
    host: str  # 16 hex digits, equal for agents on one machine
    cpus: int  # CPUs this process may run on (its affinity), at least 1


def machine_id() -> str:
    """A stable, opaque id of this machine: the first id file that reads, else the host name."""
    for path in ID_FILES:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text:
            return hashlib.sha256(text.encode()).hexdigest()[:16]
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:16]


def this_machine() -> Machine:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    return Machine(machine_id(), max(1, cpus))
