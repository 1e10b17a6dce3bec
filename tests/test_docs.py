"""The docs site builds with `mkdocs build --strict` and no warning: a page left out of the navigation, a
link to a missing page or a missing anchor fails it (mkdocs.yml's `validation`). The README stays a front
page: at most 200 lines, the two set-up commands first (.ci/run runs the second), links that reach pages."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 200


def mkdocs_build(project: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(project / "mkdocs.yml"), "--site-dir", str(site)],
                          capture_output=True, text=True, timeout=110, cwd=project)


def warnings_of(p: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (p.stdout + p.stderr).splitlines() if "WARNING" in line or "ERROR" in line]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the docs and their config, to break on purpose."""
    copy = tmp_path / "project"
    copy.mkdir()
    shutil.copy2(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", copy / "docs")
    assert mkdocs_build(copy, tmp_path / "before").returncode == 0  # the copy builds before it is broken
    return copy


@pytest.mark.loopback
def test_the_docs_build_strict_without_a_warning(tmp_path):
    p = mkdocs_build(ROOT, tmp_path / "site")
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert not warnings_of(p), warnings_of(p)
    assert (tmp_path / "site" / "index.html").exists() and (tmp_path / "site" / "packing" / "index.html").exists()


@pytest.mark.loopback
def test_a_page_left_out_of_the_navigation_fails_the_build(project, tmp_path):
    (project / "docs" / "orphan.md").write_text("# Orphan\n\nNo nav entry names this page.\n")
    p = mkdocs_build(project, tmp_path / "site")
    assert p.returncode != 0
    out = p.stdout + p.stderr
    assert 'not included in the "nav"' in out and "- orphan.md" in out, out[-3000:]


@pytest.mark.loopback
@pytest.mark.parametrize("link", ["[gone](no-such-page.md)", "[gone](options.md#no-such-section)"])
def test_a_broken_link_or_anchor_fails_the_build(project, tmp_path, link):
    page = project / "docs" / "running.md"
    page.write_text(page.read_text() + f"\nSee {link}.\n")
    p = mkdocs_build(project, tmp_path / "site")
    assert p.returncode != 0
    target = link.split("(")[1].rstrip(")").split("#")[-1]
    assert any(target in w for w in warnings_of(p)), p.stderr[-3000:]


@pytest.mark.unit
def test_the_readme_is_a_front_page_of_at_most_200_lines():
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}): move text to docs/"


@pytest.mark.unit
def test_the_readme_starts_with_the_two_commands_and_ci_runs_the_second():
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), re.S)
    assert first_block
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["bash scripts/run.sh", "bash scripts/test.sh"]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == ["bash scripts/test.sh"]


@pytest.mark.unit
def test_every_link_of_the_readme_reaches_a_file():
    targets = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert len(local) >= 20  # the results table and "where to go next" link the pages
    missing = [t for t in local if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, missing
