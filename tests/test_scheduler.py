"""Cells and schedulers: the same sweep in this process, in 2 local workers and on Ray gives the same rows.

The model is a tiny random Llama with a byte-level tokenizer (as in test_eval_runner.py), saved as a
folder, so every scheduler loads it the way a user's run does (``sinkwindow.load(folder)``). Workers
run one torch thread each.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
from collections import Counter

import pytest

from sinkwindow.eval.pricing import PAPER_MODELS, Throughput, cell_tokens, format_sweep_plan, sweep_plan
from sinkwindow.eval.results import row_key
from sinkwindow.eval.runner import EvalConfig, plan, planned_keys, run_cell, run_eval
from sinkwindow.eval.scheduler import (
    RAY_EXTRA,
    CellsFailedError,
    LocalScheduler,
    MissingExtraError,
    SerialScheduler,
    make_scheduler,
)

pytest.importorskip("sinkwindow.eval.generators.haystack")

try:
    import ray  # noqa: F401

    HAVE_RAY = True
except ImportError:
    HAVE_RAY = False


@pytest.fixture(autouse=True)
def _own_hash_cache(tmp_path_factory, monkeypatch):
    # The sha256 index lives in the cache folder: keep the user's out of the tests.
    monkeypatch.setenv("SINKWINDOW_CACHE", str(tmp_path_factory.getbasetemp() / "sinkwindow-cache"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama + byte-level BPE saved as a model folder (what every worker loads)."""
    from conftest import eval_pair

    model, tok = eval_pair()
    folder = tmp_path_factory.mktemp("tiny-model")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _config(model_dir, **kw) -> EvalConfig:
    base = dict(
        model=str(model_dir),
        methods=["full", "swa:16:4"],
        tasks=["ppl", "niah_single_1", "babilong_qa1"],
        lengths=[512],
        babilong_lengths=[0],
        ppl_lengths=[256],
        samples=3,
        ppl_windows=1,
        niah_max_new_tokens=4,
        chunk_size=64,
        babilong_chat=False,
        batch_size=2,
    )
    base.update(kw)
    return EvalConfig(**base)


KEEP = ("prediction", "score", "fingerprint", "n_prompt_tokens", "nll_sum")


def _by_key(rows) -> dict:
    return {row_key(r): {k: r.get(k) for k in KEEP} for r in rows}


def _file_keys(folder) -> Counter:
    lines = (folder / "results.jsonl").read_text().splitlines()
    return Counter(row_key(json.loads(line)) for line in lines if line.strip())


@pytest.fixture(scope="module")
def serial_rows(model_dir, tmp_path_factory):
    """The reference: the sweep in this process, the way a plain ``sinkwindow eval`` runs it."""
    out = tmp_path_factory.mktemp("serial")
    return _by_key(run_eval(_config(model_dir), out, progress=False).rows())


def test_plan_covers_every_sample_once_in_batches(model_dir, tmp_path):
    cfg = _config(model_dir)
    cells = plan(cfg)
    keys = [k for c in cells for k in c.keys]
    assert keys == planned_keys(cfg)  # every sample once, in run order
    # Perplexity windows run one per cell; the others in batches of batch_size (3 = 2 + 1).
    sizes = {(c.method, c.task): [] for c in cells}
    for c in cells:
        sizes[(c.method, c.task)].append(len(c.indices))
    assert sizes[("full", "ppl")] == [1] and sizes[("swa:16:4", "niah_single_1")] == [2, 1]
    # A cell run on its own gives one row per index, with the key fields and the cell's fingerprint.
    from sinkwindow import load

    cell = dataclasses.replace(cells[1], fingerprint="abc")
    rows = run_cell(cfg, cell, load(str(model_dir)))
    assert [row_key(r) for r in rows] == cell.keys and {r["fingerprint"] for r in rows} == {"abc"}


def test_plan_leaves_out_what_the_store_holds(model_dir, tmp_path):
    cfg = _config(model_dir)
    store = run_eval(cfg, tmp_path, progress=False)
    assert plan(cfg, settings=store.settings, done=store) == []
    # More samples: only the new index is planned, with the rows' fingerprint.
    more = _config(model_dir, samples=4)
    cells = plan(more, settings=store.settings, done=store)
    assert {c.indices for c in cells} == {(3,)} and len(cells) == 2 * 2
    assert all(c.fingerprint for c in cells)


def test_two_local_workers_give_the_serial_rows(model_dir, tmp_path, serial_rows):
    cfg = _config(model_dir)
    seen = []
    store = run_eval(
        cfg, tmp_path, progress=False, scheduler=LocalScheduler(2, threads=1), on_row=seen.append
    )
    assert _by_key(store.rows()) == serial_rows
    assert len(seen) == len(serial_rows)
    assert set(_file_keys(tmp_path).values()) == {1}  # each row written once, by the driver


@pytest.mark.skipif(not HAVE_RAY, reason=f"Ray is not installed ({RAY_EXTRA})")
def test_ray_gives_the_serial_rows(model_dir, tmp_path, serial_rows):
    from sinkwindow.eval.scheduler import RayScheduler

    cfg = _config(model_dir)
    store = run_eval(cfg, tmp_path, progress=False, scheduler=RayScheduler(local_cpus=2))
    assert _by_key(store.rows()) == serial_rows
    assert set(_file_keys(tmp_path).values()) == {1}
    import ray

    assert not ray.is_initialized()  # the instance it started is shut down


def _dies_once(marker: str, fail_task: str | None, inner, config, cell, mt, state):
    """A cell function that kills its worker after doing the first cell's work (once, then never),
    and that always raises on ``fail_task``'s cells."""
    if cell.task == fail_task:
        raise RuntimeError(f"no {fail_task} today")
    rows = inner(config, cell, mt, state)
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return rows
    os.close(fd)
    os._exit(9)  # mid-cell: the work is done, the rows never reach the driver


class _Sabotaged(LocalScheduler):
    """Local workers running ``_dies_once`` around the job's cell function."""

    def __init__(self, marker, fail_task=None, **kw):
        super().__init__(2, threads=1, **kw)
        self.marker, self.fail_task = str(marker), fail_task

    def run(self, job, cells, on_result):
        fn = functools.partial(_dies_once, self.marker, self.fail_task, job.cell_fn)
        return super().run(dataclasses.replace(job, cell_fn=fn), cells, on_result)


def test_a_killed_worker_cell_is_retried_and_written_once(model_dir, tmp_path, serial_rows, caplog):
    marker = tmp_path / "died"
    out = tmp_path / "run"
    with caplog.at_level("WARNING", logger="sinkwindow.eval.scheduler"):
        store = run_eval(_config(model_dir), out, progress=False, scheduler=_Sabotaged(marker))
    assert marker.exists()  # a worker really died mid-cell
    assert any("worker died" in r.getMessage() for r in caplog.records)
    assert _by_key(store.rows()) == serial_rows
    assert set(_file_keys(out).values()) == {1}


def test_a_cell_that_keeps_failing_is_reported_and_the_rest_kept(model_dir, tmp_path, serial_rows):
    marker = tmp_path / "died"
    marker.touch()  # nobody dies here: only the BABILong cells raise, every time
    out = tmp_path / "run"
    # The model given in memory this time: each worker gets its own pickled copy.
    from sinkwindow import load

    given = load(str(model_dir))
    with pytest.raises(CellsFailedError) as err:
        run_eval(
            _config(model_dir),
            out,
            model_and_tokenizer=given,
            progress=False,
            scheduler=_Sabotaged(marker, "babilong_qa1"),
        )
    msg = str(err.value)
    assert "\n" not in msg and "babilong_qa1" in msg and "after 3 tries" in msg and "no babilong_qa1" in msg
    assert len(err.value.failures) == 4  # 2 methods x 2 batches of BABILong, each tried 3 times
    written = _file_keys(out)
    assert set(written.values()) == {1}
    assert {k for k in serial_rows if k[1] != "babilong_qa1"} == set(written)
    # A plain re-run does only what failed.
    redone = []
    store = run_eval(_config(model_dir), out, progress=False, on_row=redone.append)
    assert {r["task"] for r in redone} == {"babilong_qa1"} and _by_key(store.rows()) == serial_rows


def test_a_model_that_fails_to_load_stops_the_run_with_its_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg = EvalConfig(model=str(empty), methods=["full"], tasks=["ppl"], ppl_lengths=[256], ppl_windows=2)
    # Raised as the loader raised it (a user error the CLI prints as one line), not retried as a death.
    with pytest.raises(FileNotFoundError, match="no config.json"):
        run_eval(cfg, tmp_path / "run", progress=False, scheduler=LocalScheduler(1, threads=1))


def test_ray_absent_is_one_line_naming_the_extra(model_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    out = tmp_path / "run"
    with pytest.raises(MissingExtraError) as err:
        run_eval(_config(model_dir, ray=True), out, progress=False)
    assert "\n" not in str(err.value) and "pip install 'sinkwindow[ray]'" in str(err.value)
    assert isinstance(err.value, ValueError)  # the CLI prints user errors as one line
    assert not out.exists()  # refused before anything was loaded or written


def test_scheduler_choice_and_bad_values(model_dir):
    assert isinstance(make_scheduler(), SerialScheduler)
    assert isinstance(make_scheduler(workers=2), LocalScheduler)
    for bad in (dict(workers=0), dict(workers="many"), dict(workers=2, ray=True), dict(ray="")):
        with pytest.raises(ValueError) as err:
            _config(model_dir, **bad)
        assert "\n" not in str(err.value)
    # "auto": one worker per core, never more than cells, the cores shared among them.
    assert LocalScheduler("auto", cores=8).sizes(3) == (3, 2)
    assert LocalScheduler("auto", cores=2).sizes(10) == (2, 1)
    assert LocalScheduler(4, cores=2).sizes(10) == (4, 1)
    assert "2 local worker" in LocalScheduler("auto", cores=2).describe(10)
    assert make_scheduler(workers=2).keep_method
    assert not make_scheduler(workers=2, keep_method=False).keep_method


def test_a_free_worker_keeps_its_method_only_when_asked():
    from sinkwindow.eval.scheduler import Cell, _next_cell

    # Task-major plan: (a, full), (a, linear), (b, full), (b, linear).
    cells = [Cell("m", method, task, 0, 0, (0,)) for task in "ab" for method in ("full", "linear")]
    pending = [1, 2, 3]  # a worker just finished (a, full)
    assert _next_cell(pending, cells, "full") == 2  # affinity: skips ahead to (b, full)
    assert _next_cell(pending, cells, None) == 1  # plan order: (a, linear), full's partner
    assert _next_cell(pending, cells, "evict") == 1  # no cell of its method: the first pending


def test_sweep_plan_counts_tokens_and_prices_them_with_its_assumptions(model_dir):
    cfg = _config(model_dir, methods=["full"], tasks=["niah_single_1", "ppl"], samples=3)
    assumed = Throughput(peak_tflops=1000.0, prefill_mfu=0.5, decode_step_overhead_s=0.05)
    p = sweep_plan([cfg], params_b={cfg.model: 2.0}, throughput=assumed)
    m = p["models"][0]
    # S-NIAH at 512: 3 samples x (512 - 128) prompt tokens, up to 4 decoded each; ppl: one 256 window.
    assert (m["cells"], m["samples"], m["gpus"]) == (3, 4, 1)
    assert m["prompt_tokens"] == 3 * 384 + 256 and m["decode_tokens"] == 3 * 4
    # Prefill: 2 FLOPs x 2e9 parameters per token at 500 TFLOP/s. Decode: 2 S-NIAH cells (batches
    # of 2 and 1) x 4 steps, each the 50 ms overhead (reading 4 GB at 2 TB/s takes 2 ms).
    seconds = 2 * 2e9 * (3 * 384 + 256) / 500e12 + 2 * 4 * 0.05
    assert m["gpu_hours"] * 3600 == pytest.approx(seconds) and p["assumptions"]["prefill_mfu"] == 0.5
    # Too big for one 80 GB GPU (2 bytes x 1.3 headroom): held on 2, so twice the GPU-hours.
    big = sweep_plan([cfg], params_b={cfg.model: 40.0}, throughput=assumed)["models"][0]
    assert big["gpus"] == 2 and big["gpu_hours"] == pytest.approx(2 * big["hours"])
    cell = plan(cfg)[0]
    assert cell_tokens(cfg, cell) == (2 * 384, 2 * 4, 4)
    unsized = sweep_plan([cfg])
    assert unsized["total"]["unsized_models"] == [cfg.model] and unsized["models"][0]["gpu_hours"] is None


def test_paper_sweep_plan_has_eleven_models(model_dir):
    assert len(PAPER_MODELS) == 11 and len({m.hub_id for m in PAPER_MODELS}) == 11
    assert [m.params_b for m in PAPER_MODELS] == sorted(m.params_b for m in PAPER_MODELS)
    p = sweep_plan(PAPER_MODELS)
    assert p["total"]["models"] == 11 and not p["total"]["unsized_models"]
    llama = next(m for m in p["models"] if m["model"] == "meta-llama/Llama-3.1-8B")
    # 4 methods x (S-NIAH 3 tasks x 4 lengths x 500 + BABILong 5 x 4 x 100).
    assert llama["samples"] == 4 * (3 * 4 * 500 + 5 * 4 * 100)
    big = next(m for m in p["models"] if m["model"] == "Qwen/Qwen2.5-72B-Instruct")
    assert big["gpus"] > 1 and big["gpu_hours"] > llama["gpu_hours"]
    phi = next(m for m in p["models"] if m["model"] == "microsoft/phi-1_5")
    assert phi["past_context"] == [4096]
    text = format_sweep_plan(p)
    assert "**total** (11 models)" in text and "Assumed: H100" in text


DRIVER = """
import os, sys, time
from sinkwindow.eval.scheduler import Cell, CellJob, LocalScheduler
import stuck

if __name__ == "__main__":
    job = CellJob(config=sys.argv[1], load=stuck.load, cell_fn=stuck.cell)
    cell = Cell(model="m", method="full", task="niah_single_1", length=512, seed=0, indices=(0,))
    LocalScheduler(workers=1, threads=1).run(job, [cell], lambda *a: None)
"""

STUCK = """
import os, time

def load():
    return None

def cell(config, cell, mt, state):
    with open(config, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
    return []
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its new parent) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="re-parenting and /proc are Linux behaviour")
def test_a_killed_driver_takes_its_busy_workers_with_it(tmp_path):
    import signal
    import subprocess
    import time

    (tmp_path / "driver.py").write_text(DRIVER)
    (tmp_path / "stuck.py").write_text(STUCK)
    pid_file = tmp_path / "worker.pid"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]), OMP_NUM_THREADS="1")
    driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(pid_file)], env=env)
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            assert driver.poll() is None, "the driver ended before its worker started the cell"
            time.sleep(0.2)
        worker = int(pid_file.read_text())
        assert _alive(worker)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 15
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(worker), "the worker kept computing after its driver was killed"
    finally:
        if driver.poll() is None:
            driver.kill()
        if pid_file.exists() and pid_file.read_text() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_more_workers_than_cells_says_so():
    from sinkwindow.eval.scheduler import LocalScheduler

    said = LocalScheduler(64, cores=2).describe(3)
    assert "3 local worker process(es) (64 asked, no more than there are cells" in said
    assert "(as asked" in LocalScheduler(2, cores=2).describe(5)
