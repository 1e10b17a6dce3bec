"""Scripts forked from a preloaded server (wansync.prefork) get what `python SCRIPT ARGS` gives them: their
environment and nothing else of the launcher's (the cluster secret included, even in /proc/self/environ),
argv, their directory on sys.path, their stderr log, exit status and atexit handlers; installed imports
run once in the server, the script's own modules once per script, the launcher's main module never.
Each case drives a fresh launcher process, which owns its fork server as `wansync train` does."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from overlay.auth import SECRET_ENV
from wansync.prefork import installed_imports

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import atexit, json, os, sys
import counted          # an installed module (on PYTHONPATH): imported once, in the server
import beside           # the script's own module: imported by every script
out = os.environ["OUT"]
def done():
    with open(out + ".atexit", "w") as f:
        f.write("ran")
atexit.register(done)
with open("/proc/self/environ", "rb") as f:
    proc_env = f.read()
json.dump({"argv": sys.argv[1:], "rank": os.environ.get("RANK"), "launcher": os.environ.get("LAUNCHER_ONLY"),
           "secret": os.environ.get("__SECRET__"),
           "secret_in_proc": b"s3cret-value" in proc_env, "path0": sys.path[0], "stdin": sys.stdin.read()},
          open(out, "w"))
print("to the log", file=sys.stderr)
if os.environ["RANK"] == "1":
    raise RuntimeError("rank 1 fails")
sys.exit(int(os.environ["RANK"]) + 3)
""".replace("__SECRET__", SECRET_ENV)

DRIVER = """
import json, os, sys
from pathlib import Path
from wansync.prefork import fork_script
work = Path(sys.argv[1])
open(work / "driver.log", "a").write("x")   # no main guard: a child must not import the launcher's main
os.environ["__SECRET__"] = "s3cret-value"   # the launcher's own: no script may see it
env = {k: v for k, v in os.environ.items() if k != "__SECRET__"}
os.environ["LAUNCHER_ONLY"] = "1"   # the launcher's, not given to the scripts
procs = [fork_script(str(work / "job" / "train.py"), ["--steps", "7"],
                     {**env, "RANK": str(r), "OUT": str(work / f"out-{r}.json")}, work / f"rank-{r}.stderr",
                     hidden=("__SECRET__",)) for r in range(3)]
print(json.dumps([p.wait(60) for p in procs]))
""".replace("__SECRET__", SECRET_ENV)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "job").mkdir()
    (tmp_path / "site").mkdir()
    (tmp_path / "job" / "train.py").write_text(SCRIPT)
    (tmp_path / "job" / "beside.py").write_text(f"open({str(tmp_path / 'beside.log')!r}, 'a').write('x')\n")
    (tmp_path / "site" / "counted.py").write_text(f"open({str(tmp_path / 'counted.log')!r}, 'a').write('x')\n")
    return tmp_path


@pytest.mark.unit
def test_a_forked_script_gets_what_python_script_would_and_installed_imports_run_once(work: Path):
    env = {**os.environ, "PYTHONPATH": f"{work / 'site'}{os.pathsep}{ROOT}"}
    env.pop(SECRET_ENV, None)
    (work / "driver.py").write_text(DRIVER)
    done = subprocess.run([sys.executable, str(work / "driver.py"), str(work)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [3, 1, 5]  # exit statuses as python would give
    for r in range(3):
        seen = json.loads((work / f"out-{r}.json").read_text())
        assert seen == {"argv": ["--steps", "7"], "rank": str(r), "launcher": None, "secret": None,
                        "secret_in_proc": False, "path0": str(work / "job"), "stdin": ""}
        assert (work / f"out-{r}.json.atexit").read_text() == "ran"
        assert "to the log" in (work / f"rank-{r}.stderr").read_text()
    assert "RuntimeError: rank 1 fails" in (work / "rank-1.stderr").read_text()
    assert (work / "counted.log").read_text() == "x"  # once, in the server: not once per script
    assert (work / "beside.log").read_text() == "xxx"  # the script's own module: once per script
    assert (work / "driver.log").read_text() == "x"


@pytest.mark.unit
def test_only_installed_top_level_imports_are_preloaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(tmp_path))  # launched from the script's directory: its modules resolve
    (tmp_path / "mine.py").write_text("")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import json
        import mine
        from numpy import linalg
        from . import sibling
        import no_such_module_anywhere
        def f():
            import csv
    """))
    assert installed_imports(script) == ["json", "numpy"]
    script.write_text("def (:\n")
    assert installed_imports(script) == []


GONE = """
import os, signal, sys, time
from pathlib import Path
from wansync.prefork import SERVER_GONE, fork_script
work = Path(sys.argv[1])
p = fork_script(str(work / "job" / "wait.py"), [], dict(os.environ), work / "wait.stderr")
os.kill(p.server.proc.pid, signal.SIGKILL)   # the server dies while its script runs
p.server.proc.wait()
assert p.poll() is None                      # the script still runs: no status yet
with open(work / "go", "w"):                 # the script, blocked reading the FIFO, may end now
    pass
print(p.wait(60) == SERVER_GONE)
"""


@pytest.mark.unit
def test_a_script_whose_server_died_still_ends_for_its_waiter(tmp_path: Path):
    (tmp_path / "job").mkdir()
    os.mkfifo(tmp_path / "go")  # the script blocks reading it until the driver opens it to write
    (tmp_path / "job" / "wait.py").write_text(f"open({str(tmp_path / 'go')!r}).read()\n")
    (tmp_path / "driver.py").write_text(GONE)
    done = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["True"], done.stderr
