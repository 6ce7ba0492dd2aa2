"""Two runs on one output folder: while a job runs, its folder is locked (an advisory lock that
dies with the process); a second run, of either command, is refused in one line naming the first
one's pid and adds no row; once the first is done (or killed) the second resumes, and every
record has exactly one row."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import bow
from rulegraph.cli import main
from rulegraph.files import LOCK, FolderLock

N = 40

#: a job in a child process that says "running" at its first task's progress and holds there (its folder
#: locked, the task's rows journaled) until the file ``release`` is made, for at most two minutes
CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from rulegraph.scale.listener import Listener

    class Held(Listener):
        first = True

        def advance(self, tokens, pairs):
            if self.first:
                self.first = False
                print("running", flush=True)
                deadline = time.monotonic() + 120
                while not Path(release).exists() and time.monotonic() < deadline:
                    time.sleep(0.02)

    kind, model, data, out, release = sys.argv[1:]
    if kind == "dataset":
        from rulegraph.scale.explain import DatasetConfig, explain_dataset
        explain_dataset(DatasetConfig(model, data, "gi", batch=4), Path(out), listener=Held())
    else:
        from rulegraph.evaluate.runner import Config, Evaluation
        Evaluation(Config(model, data, ["random", "gi"], metrics=["aopc"], batch=4), Path(out), listener=Held()).run()
""")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("lock")
    model = bow.build(root / "bow")
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps({"text": " ".join(f"w{(7 * i + j) % 90 + 1}" for j in range(3 + i % 9)),
                                        "label": i % 2}) + "\n" for i in range(N)))
    return model, data


def _start(kind: str, model: Path, data: Path, out: Path) -> subprocess.Popen:
    """The job, held after its first task until :func:`_release`."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, kind, str(model), str(data), str(out),
                              str(out.parent / "release")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = child.stdout.readline()              # the first task's rows are in the journal
    assert line.strip() == "running", child.stderr.read()[-2000:]
    return child


def _release(out: Path) -> None:
    (out.parent / "release").touch()


def _argv(kind: str, model: Path, data: Path, out: Path) -> list[str]:
    if kind == "dataset":
        return ["explain-dataset", str(model), "-m", "gi", "--data", str(data), "--out", str(out), "--batch", "4", "-q"]
    return ["evaluate", str(model), "--methods", "random,gi", "--metrics", "aopc", "--data", str(data), "--out",
            str(out), "--batch", "4", "-q"]


def _journal(kind: str, out: Path) -> list[tuple[int, str]]:
    lines = (out / ("rows.jsonl" if kind == "dataset" else "results.jsonl")).read_text().splitlines()
    return [(row["example"], row.get("method", "gi")) for row in map(json.loads, lines)]


@pytest.mark.parametrize("kind", ["dataset", "evaluate"])
def test_a_second_run_on_the_same_out_is_refused_with_the_first_ones_pid(kind, job, tmp_path, capsys):
    model, data = job
    out = tmp_path / "out"
    first = _start(kind, model, data, out)
    try:
        code = main(_argv(kind, model, data, out))
        said = capsys.readouterr()
        assert code == 2 and "Traceback" not in said.err
        errors = [line for line in said.err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"is in use by another run (pid {first.pid})" in errors[0], said.err
    finally:
        _release(out)
        assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
    methods = 1 if kind == "dataset" else 2
    journal = _journal(kind, out)
    assert len(journal) == N * methods and len(set(journal)) == N * methods       # no extra row, none twice
    assert main(_argv(kind, model, data, out)) == 0                             # now it resumes: nothing to add
    assert _journal(kind, out) == journal
    table = pq.read_table(out / ("explanations.parquet" if kind == "dataset" else "results.parquet"))
    assert table.num_rows == N * methods
    assert not (out / LOCK).exists()


def test_the_lock_dies_with_a_killed_run_and_the_next_one_completes_it(job, tmp_path, capsys):
    model, data = job
    out = tmp_path / "out"
    first = _start("dataset", model, data, out)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=60)
    assert (out / LOCK).read_text().strip() == str(first.pid)          # left behind, but no longer held
    assert main(_argv("dataset", model, data, out)) == 0
    journal = _journal("dataset", out)
    assert sorted(journal) == [(i, "gi") for i in range(N)]


def test_a_held_lock_refuses_the_library_too(job, tmp_path):
    from rulegraph.errors import InputError
    from rulegraph.scale.explain import DatasetConfig, explain_dataset
    model, data = job
    out = tmp_path / "out"
    out.mkdir()
    held = FolderLock(out)
    held.acquire()
    try:
        with pytest.raises(InputError, match=f"in use by another run \\(pid {os.getpid()}\\)"):
            explain_dataset(DatasetConfig(str(model), str(data), "gi"), out)
        assert sorted(p.name for p in out.iterdir()) == [LOCK]           # nothing written
    finally:
        held.release()
