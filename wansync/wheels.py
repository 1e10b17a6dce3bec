"""An offline wheelhouse for `wansync deploy`: this wansync as a wheel, every dependency as a wheel, and
pip itself, so a host without a package index installs with `pip install --no-index --find-links`.

The dependencies are collected once per Python version and dependency list (`pip wheel`, with this
machine's pip configuration) into ~/.cache/wansync/wheels/; the wansync wheel is built from the
source tree this wansync runs from, in a scratch copy (so the tree gets no build/ directory). A
wheel's build id is a hash of its RECORD (the hashes of every file it holds, no timestamps): a host
whose installed build id matches is not installed again. `--wheelhouse DIR` uses a ready one instead
(a wansync installed from a wheel has no source tree to build from).
"""

from __future__ import annotations

import ensurepip
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "wansync" / "wheels"
SOURCE_IGNORE = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache",
                 "tests", "scripts", "*.jsonl", "*.png")


class WheelError(RuntimeError):
    """No wheelhouse could be made (the message says why and what to do)."""


@dataclass
class Wheelhouse:
    wansync: Path  # the wansync wheel
    wheels: list[Path]  # everything to copy (wansync, its dependencies, pip)
    pip: Path  # pip's own wheel: runs from the wheel file, so a venv needs no ensurepip
    build_id: str
    python: str  # "3.11": the Python these wheels are for
    extra: tuple[str, ...] = ()  # requirements installed beside wansync (deploy --train)

    @property
    def size(self) -> int:
        return sum(p.stat().st_size for p in self.wheels)

    def needed(self, installed: str) -> list[Path]:
        """The wheels a host must be sent, given what its prefix holds (`installed`: LIST_INSTALLED's
        output): wansync's and pip's always, a dependency only if that very version is not there, so
        installing a new build does not copy torch to every host again."""
        have = {(canonical(f[0]), f[1]) for f in (line.split() for line in installed.splitlines()) if len(f) == 2}
        return [w for w in self.wheels if w in (self.wansync, self.pip) or wheel_dist(w) not in have]


# run by a host's venv Python: one "NAME VERSION" line per installed distribution
LIST_INSTALLED = "import importlib.metadata as m\nfor d in m.distributions(): print(d.metadata['Name'], d.version)"


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_dist(wheel: Path) -> tuple[str, str]:
    """(canonical name, version) that a wheel's file name declares (PEP 427: NAME-VERSION-...)."""
    name, version = wheel.name.split("-")[:2]
    return canonical(name), version


def build_id(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        return hashlib.sha256(z.read(record)).hexdigest()[:16]


def source_tree() -> Path | None:
    """The project this wansync was imported from, if it is a source tree (editable install)."""
    root = Path(__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if pyproject.exists():
        try:
            if tomllib.loads(pyproject.read_text()).get("project", {}).get("name") == "wansync":
                return root
        except tomllib.TOMLDecodeError:
            return None
    return None


def source_hash(src: Path) -> str:
    """Of every file a wheel of `src` would be built from (names and contents)."""
    h = hashlib.sha256()
    ignore = shutil.ignore_patterns(*SOURCE_IGNORE)
    for dirpath, dirnames, filenames in os.walk(src):
        skip = ignore(dirpath, dirnames + filenames)
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        for name in sorted(f for f in filenames if f not in skip):
            path = Path(dirpath) / name
            h.update(str(path.relative_to(src)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _pip(*args: str, what: str) -> None:
    p = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise WheelError(f"{what} failed: {(p.stderr or p.stdout).strip()[-1500:]}")


def _pip_wheel() -> Path:
    bundled = Path(ensurepip.__file__).parent / "_bundled"
    found = sorted(bundled.glob("pip-*.whl"))
    if not found:
        raise WheelError(f"no pip wheel in {bundled} (this Python has no ensurepip): use --wheelhouse with pip's "
                         "wheel in it")
    return found[-1]


def prepare(wheelhouse: Path | None = None, cache: Path = CACHE, extra: tuple[str, ...] = ()) -> Wheelhouse:
    """The wheelhouse to copy: `wheelhouse` as given, or built here (dependencies cached). `extra`:
    requirements installed beside wansync (`deploy --train`: torch and the script's packages); their
    wheels are collected with the dependencies and they are part of the build id a host is checked by."""
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if wheelhouse is not None:
        wheels = sorted(Path(wheelhouse).glob("*.whl"))
        own = [w for w in wheels if w.name.startswith("wansync-")]
        if not own:
            raise WheelError(f"--wheelhouse {wheelhouse}: no wansync-*.whl in it")
        pips = [w for w in wheels if w.name.startswith("pip-")]
        pip = pips[-1] if pips else _pip_wheel()
        if not pips:
            wheels.append(pip)
        return Wheelhouse(own[-1], wheels, pip, _with_extra(build_id(own[-1]), extra), py, extra)
    src = source_tree()
    if src is None:
        raise WheelError("this wansync was not installed from a source tree, so it cannot build its own wheel: "
                         "give --wheelhouse DIR (pip wheel wansync -w DIR, with the hosts' Python version)")
    deps = [*tomllib.loads((src / "pyproject.toml").read_text())["project"].get("dependencies", []), *extra]
    key = hashlib.sha256("\n".join(sorted(deps)).encode()).hexdigest()[:12]
    dep_dir = cache / f"py{py}-{key}"
    if not (dep_dir / ".complete").exists():
        dep_dir.mkdir(parents=True, exist_ok=True)
        _pip("wheel", "-q", "--wheel-dir", str(dep_dir), *deps, what="collecting the dependencies' wheels")
        (dep_dir / ".complete").write_text("\n".join(deps) + "\n")
    own_dir = cache / "own" / f"src-{source_hash(src)}"  # the same sources: the wheel built before
    own = next(own_dir.glob("wansync-*.whl"), None) if own_dir.is_dir() else None
    if own is None:
        with tempfile.TemporaryDirectory(prefix="wansync-src-") as tmp:
            copy = Path(tmp) / "src"
            shutil.copytree(src, copy, ignore=shutil.ignore_patterns(*SOURCE_IGNORE))
            out = Path(tmp) / "out"
            _pip("wheel", "-q", "--no-deps", "--wheel-dir", str(out), str(copy), what="building the wansync wheel")
            built = next(out.glob("wansync-*.whl"))
            own_dir.mkdir(parents=True, exist_ok=True)
            own = own_dir / built.name
            shutil.copy2(built, own)
    bid = _with_extra(build_id(own), extra)
    pip = _pip_wheel()
    wheels = [own, pip] + sorted(w for w in dep_dir.glob("*.whl") if not w.name.startswith(("wansync-", "pip-")))
    return Wheelhouse(own, wheels, pip, bid, py, extra)


def _with_extra(bid: str, extra: tuple[str, ...]) -> str:
    """A host with wansync's build but not the extra requirements is installed again."""
    if not extra:
        return bid
    return bid + "+" + hashlib.sha256("\n".join(sorted(extra)).encode()).hexdigest()[:8]
