"""`wansync plot`: PNG figures from a results file recorded by a real (short) `wansync run`."""

import asyncio
import json
import subprocess
import sys

import numpy as np
import pytest
from helpers.cluster import Cluster
from helpers.exact import digest_of, exact_sum
from matplotlib import image

from emulation.topology import uniform
from scheduler.live import LiveState
from wansync.plot import PlotError, overlap_max, plot, task_outcome
from wansync.results import Recorder, Results

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


@pytest.mark.loopback
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


@pytest.mark.loopback
def test_speedup_is_skipped_without_a_star_baseline(recorded, tmp_path):
    src = write(tmp_path / "mst.jsonl", [r for r in recorded if r.get("scheme") != "star"])
    written, skipped = plot(src)
    assert sorted(p.name for p in written) == ["mst_link_throughput.png", "mst_round_times.png"]
    assert len(skipped) == 1 and "mst_speedup.png" in skipped[0] and "no star rounds" in skipped[0]
    for p in written:
        assert_real_png(p)


@pytest.mark.loopback
def test_schema_1_files_plot_throughput_from_passive_samples(recorded, tmp_path):
    old = [{**r, "schema": 1} for r in recorded if r["type"] not in ("throughput", "event")]
    assert any(r["type"] == "link_sample" for r in old)
    written, _ = plot(write(tmp_path / "old.jsonl", old))
    assert tmp_path / "old_link_throughput.png" in written
    assert_real_png(tmp_path / "old_link_throughput.png")


@pytest.mark.loopback
def test_a_torn_last_line_still_plots(recorded, tmp_path):
    src = tmp_path / "torn.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recorded) + '{"schema": 2, "type": "rou')
    written, _ = plot(src)
    assert len(written) == 3


@pytest.mark.unit
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


@pytest.mark.loopback
def test_plot_command_reports_a_missing_file(tmp_path):
    res = subprocess.run([sys.executable, "-m", "wansync.cli", "plot", str(tmp_path / "missing.jsonl")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "cannot read" in res.stderr and not list(tmp_path.glob("*.png"))


TASK_PARAMS = 60_000


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A schema-3 file from a real in-process cluster: a BSP job (star, 2 rounds), then a tasks job of
    two batches of three concurrent partial reduces, each with its hub outside its members."""
    out = tmp_path_factory.mktemp("tasks") / "mixed.jsonl"

    async def run():
        topo = uniform(4, 50).scaled(0.01)
        c = Cluster("p1", topo, shaped=True)
        sched = c.sched
        results = Results(out)
        Recorder(results, sched, LiveState(sched))
        try:
            await c.start(20)
            await asyncio.wait_for(sched.run_job("star", rounds=2, params=TASK_PARAMS, chunk_params=6_000), 60)
            js = sched.open_tasks("star", params=TASK_PARAMS, chunk_params=6_000)
            recs = []
            for _ in range(2):
                recs += await asyncio.wait_for(asyncio.gather(*(
                    sched.run_task(js, [n for n in range(4) if n != hub], options={"hub": hub}) for hub in (1, 2, 3))),
                    60)
            await sched.close_job(js)
            for r in recs:  # the file's tasks are exact, as computed here
                want = digest_of(exact_sum(r.round, r.members, TASK_PARAMS))
                assert not r.aborted and set(r.digests.values()) == {want}, r
        finally:
            await c.close()
            results.close()

    asyncio.run(run())
    return [json.loads(line) for line in out.read_text().splitlines()]


def tasks_job_of(recs):
    return next(r["data"]["job"] for r in recs if r["type"] == "event" and r["kind"] == "job"
                and r["data"]["mode"] == "tasks")


@pytest.mark.loopback
def test_task_timelines_are_drawn_for_tasks_jobs_only(mixed, tmp_path):
    assert {r["schema"] for r in mixed} == {3}
    job = tasks_job_of(mixed)
    tasks = [r for r in mixed if r["type"] == "task" and r["job"] == job]
    assert len(tasks) == 6 and all(r["aggregators"] and r["spans"] for r in tasks)
    written, skipped = plot(write(tmp_path / "mixed.jsonl", mixed))
    names = {p.name for p in written}  # (a run of a second or two may have too few throughput points)
    assert {"mixed_round_times.png", "mixed_speedup.png", "mixed_task_timelines.png"} <= names, skipped
    for p in written:
        assert_real_png(p)
    # the BSP job's rounds alone make the round-time figure: drop them and it has nothing to draw
    only = [r for r in mixed if r["type"] != "task" or r["job"] == job]
    written, skipped = plot(write(tmp_path / "only.jsonl", only))
    assert tmp_path / "only_task_timelines.png" in written
    assert any("only_round_times.png" in s and "no round records" in s for s in skipped), skipped
    assert_real_png(tmp_path / "only_task_timelines.png")


@pytest.mark.loopback
def test_no_task_timelines_without_a_tasks_job(recorded, tmp_path):
    written, skipped = plot(write(tmp_path / "bsp.jsonl", recorded))
    assert len(written) == 3 and not any("task_timelines" in s for s in [p.name for p in written] + skipped)


@pytest.mark.loopback
def test_schema_2_round_records_still_plot(recorded, tmp_path):
    old_fields = ("job", "scheme", "round", "version", "round_s", "compute_s", "ok", "digests_agree",
                  "versions_agree", "t_start", "t_end", "warmup", "errors", "prediction_s")
    old = [{**({k: r[k] for k in old_fields} if r["type"] == "task" else r), "schema": 2,
            "type": "round" if r["type"] == "task" else r["type"]} for r in recorded]
    assert any(r["type"] == "round" for r in old) and not any(r["type"] == "task" for r in old)
    written, _ = plot(write(tmp_path / "v2.jsonl", old))
    assert sorted(p.name for p in written) == ["v2_link_throughput.png", "v2_round_times.png", "v2_speedup.png"]


@pytest.mark.unit
def test_task_outcomes_and_overlap():
    assert task_outcome({"ok": True, "digests_agree": True}) == "exact"
    assert task_outcome({"ok": True, "digests_agree": False}) == "failed"
    assert task_outcome({"ok": False, "digests_agree": True, "aborted": True}) == "aborted"
    assert overlap_max([(0, 2), (1, 3), (1.5, 1.8), (3, 4)]) == 3
    assert overlap_max([(0, 1), (1, 2)]) == 1  # one ends as the next starts: never together


@pytest.mark.unit
def test_accuracy_vs_time_is_drawn_from_a_training_runs_accuracy_records(tmp_path):
    from wansync.accuracy_plot import mean_curve

    f = tmp_path / "train.jsonl"
    lines = [{"schema": 3, "type": "run", "topology": "switch:4", "nodes": 2}]
    for scheme, speed in (("sr-iid", 2.0), ("pr-iid", 1.0)):
        for node in (0, 1):
            for k in range(6):
                lines.append({"schema": 3, "type": "accuracy", "scheme": scheme, "node": node, "t_rel": k + node / 2,
                              "iteration": k, "accuracy": min(0.97, 0.1 + 0.15 * speed * k)})
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    written, skipped = plot(f, tmp_path)
    assert tmp_path / "train_accuracy.png" in written
    assert_real_png(tmp_path / "train_accuracy.png")
    ts, ys = mean_curve([(0.0, 0, 0.2), (0.5, 1, 0.4), (1.0, 0, 0.6)])
    assert ts == [0.5, 1.0] and ys == [pytest.approx(0.3), pytest.approx(0.5)]  # from when both evaluated


@pytest.mark.loopback
def test_an_auto_run_plots_its_decisions_against_its_rounds(tmp_path):
    """A real `--schemes auto` run: the auto figure is drawn from its decisions and rounds."""
    out = tmp_path / "a.jsonl"
    res = subprocess.run([sys.executable, "-m", "wansync.cli", "run", "--nodes", "4", "--topology", "hetero",
                          "--schemes", "auto", "--scale", "0.005", "--rounds", "2", "--no-http", "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    decisions = [json.loads(line) for line in out.read_text().splitlines() if '"kind": "auto"' in line]
    assert decisions and all(d["data"]["candidates"] for d in decisions)
    written, _ = plot(out, tmp_path / "fig")
    assert tmp_path / "fig" / "a_auto.png" in written
    assert_real_png(tmp_path / "fig" / "a_auto.png")
