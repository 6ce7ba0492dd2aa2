"""The ``ray`` engine on a local Ray cluster: the same rows as the local engine, for
``explain-dataset`` and ``evaluate``; no row lost or duplicated when a worker is killed mid-run
or a record is malformed; without Ray installed, ``--engine ray`` says how to install it."""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from listeners import StrictListener
from rulegraph.errors import InputError
from rulegraph.evaluate.runner import Config, Evaluation
from rulegraph.scale import Task, engine
from rulegraph.scale.explain import DatasetConfig, explain_dataset

ray = pytest.importorskip("ray", reason="the ray extra (pip install 'rulegraph[ray]'); `make test` installs it")
TIMING = ("explain_seconds", "metric_seconds")


@pytest.fixture(autouse=True)
def _one_thread():
    """The local engine with the threads of one Ray worker (--cpus-per-worker 1): float reductions
    (the audit's sums) depend on the thread count, so rows are identical given seed, dtype and threads."""
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def data(corpus, tmp_path_factory):
    """The corpus's texts as JSON lines, with one malformed record in the middle."""
    _, texts, _ = corpus
    path = tmp_path_factory.mktemp("data") / "data.jsonl"
    lines = [json.dumps({"text": t, "label": i % 2}) for i, t in enumerate(texts)]
    lines.insert(len(lines) // 2, '{"text": "unterminated')
    path.write_text("\n".join(lines) + "\n")
    return path


def untimed(rows):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


class KillOnce(StrictListener):
    """Kills one Ray worker (SIGKILL) when the first task's rows arrive: its tasks in flight die with it
    (and holds the job to the listener's call order on Ray as well)."""

    def __init__(self, ray_engine):
        super().__init__()
        self.engine, self.killed = ray_engine, None

    def advance(self, tokens, pairs):
        super().advance(tokens, pairs)
        if self.killed is None:
            self.killed = self.engine.pids[0]
            os.kill(self.killed, signal.SIGKILL)


def test_explain_dataset_on_ray_equals_local_with_a_worker_killed(corpus, data, cluster, tmp_path):
    model, texts, _ = corpus
    config = DatasetConfig(str(model), str(data), "lrp-ah-ln", batch=4)
    local = explain_dataset(config, tmp_path / "local")
    on_ray = engine("ray", num_workers=2)
    listener = KillOnce(on_ray)
    remote = explain_dataset(config, tmp_path / "ray", engine=on_ray, listener=listener)
    assert listener.killed is not None and listener.killed not in on_ray.pids      # killed, and replaced
    listener.check()
    a = pq.read_table(tmp_path / "local" / "explanations.parquet").to_pylist()
    b = pq.read_table(tmp_path / "ray" / "explanations.parquet").to_pylist()
    assert len(texts) + 1 >= 51 and len(a) == len(texts) + 1
    assert [r["example"] for r in b] == list(range(len(texts) + 1))          # none lost, none twice
    assert untimed(a) == untimed(b)
    assert local["failed"] == remote["failed"] == 1
    assert "not a JSON object" in b[len(texts) // 2]["error"]
    journal = [json.loads(line)["example"] for line in (tmp_path / "ray" / "rows.jsonl").read_text().splitlines()]
    assert sorted(journal) == list(range(len(texts) + 1))


def test_top_units_on_ray_equal_the_local_engines(bert_onnx, cluster, tmp_path):
    """``--at`` / ``--top``: the rows' per-unit relevance is made by the workers, the ranking on the driver."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("the cat sat on the mat", "a dog", "the mat")))
    config = DatasetConfig(str(bert_onnx), str(data), "attnlrp", dtype="float64", batch=2,
                           at=["every attention output"], top=4)
    local = explain_dataset(config, tmp_path / "local", progress=False)
    remote = explain_dataset(config, tmp_path / "ray", engine=engine("ray", num_workers=1), progress=False)
    assert remote["top_units"] == local["top_units"] and len(local["top_units"]) == 4
    a = pq.read_table(tmp_path / "local" / "explanations.parquet").to_pylist()
    b = pq.read_table(tmp_path / "ray" / "explanations.parquet").to_pylist()
    assert [r["units"] for r in a] == [r["units"] for r in b]


def test_evaluate_on_ray_equals_local_with_a_worker_killed(corpus, cluster, tmp_path):
    model, texts, _ = corpus
    path = tmp_path / "data.csv"
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([["text", "label"], *[[t, i % 2] for i, t in enumerate(texts)]])
    config = Config(model=str(model), data=str(path), methods=["random", "gi", "lrp-ah-ln"], metrics=["aopc", "lodds"],
                    removal="unk", batch=4)
    local = Evaluation(config, tmp_path / "local", progress=True).run()
    on_ray = engine("ray", num_workers=2)
    listener = KillOnce(on_ray)
    remote = Evaluation(config, tmp_path / "ray", listener=listener, engine=on_ray).run()
    assert listener.killed is not None
    listener.check()
    key = lambda r: (r["example"], r["method"])       # noqa: E731
    assert sorted(map(key, remote.rows)) == sorted({key(r) for r in remote.rows})       # none twice
    assert len(remote.rows) == len(texts) * 3
    assert untimed(sorted(local.rows, key=key)) == untimed(sorted(remote.rows, key=key))
    assert local.table == remote.table


def _never_built():
    raise AssertionError("no worker may start on a cluster without room for them")


@pytest.mark.parametrize("options, message", [
    ({"num_workers": 3}, "the running Ray instance has room for 2 workers of 1 CPU (2 CPU, 0 GPU in all), not 3: "
                         "lower --num-workers to 2"),
    ({"num_workers": 1, "cpus_per_worker": 4}, "a worker asks for 4 CPU (--cpus-per-worker, --gpus-per-worker) "
                                               "and no node of the running Ray instance has that (2 CPU, 0 GPU in all)"),
    ({"num_workers": 1, "gpus_per_worker": 0.5}, "a worker asks for 1 CPU and 0.5 GPU"),
])
def test_a_cluster_without_room_for_the_workers_is_refused_before_any_starts(cluster, options, message):
    """Ray would wait for the resources without a word: the engine says what does not fit."""
    if ray.cluster_resources().get("GPU"):
        pytest.skip("this machine's Ray cluster has GPUs")
    on_ray = engine("ray", **options)
    with pytest.raises(InputError) as caught:
        on_ray.run(_never_built, [Task(0, None)], lambda *_: pytest.fail("no task may run"))
    assert message in str(caught.value)
    assert on_ray.pids == []


@pytest.mark.parametrize("gpus, device, message", [
    (0, "cuda", "--device cuda on Ray workers needs --gpus-per-worker"),
    (0.5, "cpu", "--gpus-per-worker 0.5 reserves GPUs that --device cpu leaves idle; add --device cuda"),
])
def test_gpus_and_device_that_disagree_are_refused_before_any_file_is_written(corpus, data, tmp_path, gpus, device,
                                                                              message):
    """Through the library as through the CLI: the check belongs to the engine."""
    model, _, _ = corpus
    on_ray = engine("ray", num_workers=1, gpus_per_worker=gpus)
    with pytest.raises(InputError, match=re.escape(message)):
        explain_dataset(DatasetConfig(str(model), str(data), "gi", device=device), tmp_path / "rows", engine=on_ray)
    with pytest.raises(InputError, match=re.escape(message)):
        Evaluation(Config(str(model), str(data), ["gi"], device=device), tmp_path / "eval", engine=on_ray).run()
    assert not (tmp_path / "rows").exists() and not (tmp_path / "eval").exists()
    assert on_ray.pids == []


def test_without_ray_the_ray_engine_says_how_to_install_it(corpus, data, tmp_path):
    model, _, _ = corpus
    code = ("import sys; sys.modules['ray'] = None\n"
            "from rulegraph.cli import main\n"
            f"sys.exit(main(['explain-dataset', {str(model)!r}, '--method', 'gi', '--data', {str(data)!r}, "
            f"'--out', {str(tmp_path / 'out')!r}, '--engine', 'ray']))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    assert "pip install 'rulegraph[ray]'" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "out").exists()


#: a driver whose one worker sleeps; it says "running" once the worker is up
SLEEPING_DRIVER = """
import threading, time
from rulegraph.scale import Task, engine

class Sleeper:
    def __call__(self, payload):
        time.sleep(300)
        return []

def sleeper():
    return Sleeper()

on_ray = engine("ray", num_workers=1)

def say():
    while not on_ray.pids:
        time.sleep(0.1)
    time.sleep(1.0)
    print("running", flush=True)

threading.Thread(target=say, daemon=True).start()
on_ray.run(sleeper, [Task(0, None)], lambda *_: None)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reaper reads /proc")
def test_a_driver_killed_with_sigkill_leaves_no_process_of_its_cluster():
    """Ray's dashboard and runtime-env agents outlive a driver killed with SIGKILL (the raylet's
    children); the engine's reaper kills every process of the cluster the driver started."""
    from rulegraph.scale.reaper import _stat, descendants
    driver = subprocess.Popen([sys.executable, "-c", SLEEPING_DRIVER], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert driver.stdout.readline().strip() == "running", driver.stderr.read()[-2000:]
        tree = descendants(driver.pid)
        names = {Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace") for pid in tree}
        assert any("raylet" in n for n in names) and any("Agent" in n or "agent" in n for n in names), names
    finally:
        driver.kill()
        driver.wait(timeout=60)
    deadline = time.monotonic() + 30
    alive = tree
    while alive and time.monotonic() < deadline:
        alive = {pid: start for pid, start in tree.items() if (_stat(pid) or (0, None))[1] == start}
        time.sleep(0.5)
    assert not alive, {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:80] for pid in alive}


def test_address_auto_without_a_cluster_is_one_line_before_any_file(monkeypatch, corpus, data, tmp_path):
    """``--address auto`` where no cluster runs (Ray itself raises ConnectionError, exit 3 before)."""
    import ray._private.services as services
    monkeypatch.setattr(services, "find_gcs_addresses", lambda *a, **k: set())
    monkeypatch.setattr(services, "find_bootstrap_address", lambda *a, **k: None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    model, _, _ = corpus
    with pytest.raises(InputError, match="--address auto: no running Ray cluster was found on this machine"):
        explain_dataset(DatasetConfig(str(model), str(data), "gi"), tmp_path / "rows", engine=engine("ray", address="auto"))
    assert not (tmp_path / "rows").exists()
