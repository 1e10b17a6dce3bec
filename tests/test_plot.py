"""`wansync plot`: PNG figures from a results file recorded by a real (short) `wansync run`."""

import json
import subprocess
import sys

import numpy as np
import pytest
from matplotlib import image

from wansync.plot import PlotError, plot

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One real run: 4 agents on a heterogeneous mesh, the star baseline and mst, 2 measured rounds each."""
    d = tmp_path_factory.mktemp("run")
    out = d / "r.jsonl"
    res = subprocess.run([sys.executable, "-m", "wansync.cli", "run", "--nodes", "4", "--topology", "hetero",
                          "--schemes", "star,mst", "--scale", "0.005", "--rounds", "2", "--no-http", "--out",
                          str(out)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def assert_real_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG and len(data) > 2048, path
    pixels = image.imread(path)
    assert pixels.shape[0] > 200 and pixels.shape[1] > 300
    assert float(np.std(pixels[..., :3])) > 0.01  # something was drawn, not a blank canvas


def test_plot_command_writes_every_figure(recorded, tmp_path):
    src = write(tmp_path / "r.jsonl", recorded)
    res = subprocess.run([sys.executable, "-m", "wansync.cli", "plot", str(src), "--out-dir", str(tmp_path / "fig")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    written = sorted(p.name for p in (tmp_path / "fig").glob("*.png"))
    assert written == ["r_link_throughput.png", "r_round_times.png", "r_speedup.png"]
    assert res.stdout.split() == [str(tmp_path / "fig" / n) for n in
                                  ("r_round_times.png", "r_link_throughput.png", "r_speedup.png")]
    for name in written:
        assert_real_png(tmp_path / "fig" / name)


def test_speedup_is_skipped_without_a_star_baseline(recorded, tmp_path):
    src = write(tmp_path / "mst.jsonl", [r for r in recorded if r.get("scheme") != "star"])
    written, skipped = plot(src)
    assert sorted(p.name for p in written) == ["mst_link_throughput.png", "mst_round_times.png"]
    assert len(skipped) == 1 and "mst_speedup.png" in skipped[0] and "no star rounds" in skipped[0]
    for p in written:
        assert_real_png(p)


def test_schema_1_files_plot_throughput_from_passive_samples(recorded, tmp_path):
    old = [{**r, "schema": 1} for r in recorded if r["type"] not in ("throughput", "event")]
    assert any(r["type"] == "link_sample" for r in old)
    written, _ = plot(write(tmp_path / "old.jsonl", old))
    assert tmp_path / "old_link_throughput.png" in written
    assert_real_png(tmp_path / "old_link_throughput.png")


def test_a_torn_last_line_still_plots(recorded, tmp_path):
    src = tmp_path / "torn.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recorded) + '{"schema": 2, "type": "rou')
    written, _ = plot(src)
    assert len(written) == 3


@pytest.mark.parametrize("content, message", [
    ("", "no records"),
    ('{"schema": 99, "type": "run"}\n', "schema 99"),
    ('not json\n{"schema": 2, "type": "run"}\n', "not JSON"),
    ('{"schema": 2, "type": "run"}\n', "nothing to plot"),
])
def test_unplottable_files_fail_with_the_reason(tmp_path, content, message):
    src = tmp_path / "bad.jsonl"
    src.write_text(content)
    with pytest.raises(PlotError, match=message):
        plot(src)


def test_plot_command_reports_a_missing_file(tmp_path):
    res = subprocess.run([sys.executable, "-m", "wansync.cli", "plot", str(tmp_path / "missing.jsonl")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "cannot read" in res.stderr and not list(tmp_path.glob("*.png"))
