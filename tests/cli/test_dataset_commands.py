"""``rulegraph explain-dataset`` and ``rulegraph evaluate`` as a user types them: the installed
entry point, output logged to files (no ``-q``: the progress bar is drawn), on the local engine
and on Ray; ``-q`` draws no bar; the terminal listener itself logged to a file and on a
pseudo-terminal."""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

import bow
from shell import on_terminal, rulegraph

TEXTS = ["w1 w2 w3 w4", "w5 w6 w7", "w8 w9 w10 w11 w12", "w13 w14"]
BAR = "━"           # rich's bar: drawn once, finished, when the output is a file


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The bag-of-words model's folder, as ``rulegraph export`` lays one out (model.onnx + tokenizer.json)."""
    return bow.build(tmp_path_factory.mktemp("bow_commands")).parent


@pytest.fixture(scope="module")
def data(model):
    path = model.parent / "data.csv"
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([["text", "label"], *[[t, i % 2] for i, t in enumerate(TEXTS)]])
    return path


ENGINES = {"local": [], "ray": ["--engine", "ray", "--num-workers", "2"]}


@pytest.mark.parametrize("engine, given", [("local", "folder"), ("local", "file"), ("ray", "folder")])
def test_explain_dataset_runs_as_typed(model, data, tmp_path, engine, given):
    if engine == "ray":
        pytest.importorskip("ray")
    target = model if given == "folder" else model / "model.onnx"
    ran = rulegraph(["explain-dataset", target, "-r", "lrp-ah-ln", "--data", data, "--out", "explained",
                     *ENGINES[engine]], tmp_path)
    ran.ok()
    rows = pq.read_table(tmp_path / "explained" / "explanations.parquet").to_pylist()
    assert [r["text"] for r in rows] == TEXTS and all(r["error"] is None for r in rows)
    assert f"{len(TEXTS)} rows: {len(TEXTS)} explained, 0 failed ({engine}" in ran.out
    assert BAR in ran.err and f"{len(TEXTS)}/{len(TEXTS)} explained" in ran.err


@pytest.mark.parametrize("engine", ENGINES)
def test_evaluate_runs_as_typed(model, data, tmp_path, engine):
    if engine == "ray":
        pytest.importorskip("ray")
    ran = rulegraph(["evaluate", model, "--data", data, "--methods", "random,gi", "--out", "eval",
                     *ENGINES[engine]], tmp_path)
    ran.ok()
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["n_examples"] == len(TEXTS)
    assert f"faithfulness on {len(TEXTS)} examples" in ran.out and "random" in ran.out and "gi" in ran.out
    assert BAR in ran.err and f"{2 * len(TEXTS)}/{2 * len(TEXTS)} explained" in ran.err


@pytest.mark.parametrize("command", [
    ["explain-dataset", "{model}", "-m", "gi", "--out", "o"],
    ["evaluate", "{model}", "--methods", "gi", "--out", "o"],
])
def test_quiet_draws_no_bar(model, data, tmp_path, command):
    args = [str(model) if a == "{model}" else a for a in command]
    ran = rulegraph([*args, "--data", data, "-q"], tmp_path)
    ran.ok()
    assert BAR not in ran.err and "explained" not in ran.err.replace("explanations", ""), ran.err
    loud = rulegraph([*args, "--data", data, "--force"], tmp_path)
    loud.ok()
    assert BAR in loud.err


def test_evaluate_on_a_terminal_draws_the_bar(model, data, tmp_path):
    ran = on_terminal(["evaluate", model, "--data", data, "--methods", "gi", "--out", "eval"], tmp_path)
    ran.ok()
    assert BAR in ran.out and "\x1b[" in ran.out and "faithfulness on" in ran.out


LISTENER = """
from rulegraph.cli.evaluate import TerminalListener, err
listener = TerminalListener(err)
listener.note("before start")
listener.start(10, "0/2 explained")
listener.method("gi")
listener.advance(4, "1/2 explained")
listener.method("ig")
listener.advance(6, "2/2 explained")
listener.stop()
listener.note("after stop", "error")
"""


def test_the_terminal_listener_logged_to_a_file(tmp_path):
    log = tmp_path / "err.log"
    with log.open("wb") as handle:
        done = subprocess.run([sys.executable, "-c", LISTENER], stderr=handle, stdout=subprocess.DEVNULL)
    text = log.read_text()
    assert done.returncode == 0, text
    lines = text.splitlines()
    assert lines[0] == "before start" and lines[-1] == "after stop" and "\x1b[" not in text
    bar, = lines[1:-1]                  # the finished bar, once: no redraws in a log
    assert "ig" in bar and BAR in bar and "2/2 explained" in bar


def test_the_terminal_listener_on_a_terminal(tmp_path):
    import os
    import pty
    leader, follower = pty.openpty()
    child = subprocess.Popen([sys.executable, "-c", LISTENER], stdin=follower, stdout=follower, stderr=follower,
                             env={**os.environ, "TERM": "xterm-256color"})
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    text = b"".join(chunks).decode()
    assert child.wait(timeout=60) == 0, text
    assert "before start" in text and "after stop" in text
    assert "evaluating" in text and "0/2 explained" in text           # drawn at start
    assert "ig" in text and "2/2 explained" in text and BAR in text     # and redrawn as it went
    assert "\x1b[31mafter stop" in text                                 # an error note in red


def test_explain_dataset_top_units_as_typed(bert_onnx, tmp_path):
    """``--at`` adds each row's per-unit relevance to the Parquet table; ``--top K`` writes the K units carrying
    the most over the data set and prints them."""
    data = tmp_path / "texts.csv"
    with data.open("w", newline="") as handle:
        csv.writer(handle).writerows([["text"], ["the cat sat on the mat"], ["a dog"]])
    r = rulegraph(["explain-dataset", bert_onnx, "--rules", "attnlrp", "--data", data, "--out", "out", "--at",
                   "every attention output", "--top", "3", "-q"], tmp_path)
    assert r.code == 0, r.err
    top = json.loads((tmp_path / "out" / "top-units.json").read_text())
    assert len(top) == 3 and all(u["kind"] == "head" for u in top)
    assert "units carrying the most relevance" in r.out and f"head {top[0]['unit']}" in r.out
    table = pq.read_table(tmp_path / "out" / "explanations.parquet").to_pylist()
    assert [len(row["units"]) for row in table] == [2, 2]
    bad = rulegraph(["explain-dataset", bert_onnx, "--method", "loo", "--data", data, "--out", "o2", "--at",
                     "every attention output"], tmp_path)
    assert bad.code != 0 and "--at reads the relevance pass" in bad.err and "Traceback" not in bad.err
