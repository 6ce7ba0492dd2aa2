"""A run's outputs, whole or not at all: `rulegraph explain`'s --json, --html and --png checked
together before any is written (two on one file, an existing one without --force, an input), and
several texts drawn one PNG each."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import matplotlib.image
import pytest

from rulegraph.cli import main

TEXTS = ["-t", "a great movie", "-t", "a poor movie", "-t", "an odd one"]


def _listing(folder):
    return sorted(p.name for p in folder.iterdir())


def test_json_and_html_on_one_file_write_nothing(bert_onnx, tmp_path, capsys):
    out = tmp_path / "out.json"
    assert main(["explain", str(bert_onnx), "-r", "gi", *TEXTS[:2], "--json", str(out), "--html", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--json and --html both name" in err and len(err.strip().splitlines()) == 1
    assert _listing(tmp_path) == []


def test_one_name_reached_two_ways_is_refused(bert_onnx, tmp_path, capsys):
    (tmp_path / "sub").mkdir()
    assert main(["explain", str(bert_onnx), "-r", "gi", *TEXTS[:2], "--json", str(tmp_path / "o.html"),
                 "--html", str(tmp_path / "sub" / ".." / "o.html")]) == 2
    assert "both name" in capsys.readouterr().err and _listing(tmp_path) == ["sub"]


def test_an_existing_png_refuses_the_whole_run(bert_onnx, tmp_path, capsys):
    """The PNG is checked with the JSON and the HTML: none is written when it cannot be."""
    (tmp_path / "e-2.png").write_bytes(b"the user's")
    code = main(["explain", str(bert_onnx), "-r", "gi", *TEXTS, "--json", str(tmp_path / "e.json"),
                 "--html", str(tmp_path / "e.html"), "--png", str(tmp_path / "e.png")])
    assert code == 2 and "e-2.png exists; pass --force" in capsys.readouterr().err
    assert _listing(tmp_path) == ["e-2.png"] and (tmp_path / "e-2.png").read_bytes() == b"the user's"


def test_several_texts_draw_one_png_each(bert_onnx, tmp_path):
    """As a user runs it (a subprocess): `-t A -t B -t C --html --json --png e.png` writes all five
    outputs, the PNGs numbered in the order of the texts."""
    args = [sys.executable, "-m", "rulegraph.cli", "explain", str(bert_onnx), "-r", "gi", *TEXTS,
            "--json", str(tmp_path / "e.json"), "--html", str(tmp_path / "e.html"), "--png", str(tmp_path / "e.png")]
    run = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr
    assert _listing(tmp_path) == ["e-1.png", "e-2.png", "e-3.png", "e.html", "e.json"]
    assert len(json.loads((tmp_path / "e.json").read_text())) == 3
    pictures = [matplotlib.image.imread(str(tmp_path / f"e-{i}.png")) for i in (1, 2, 3)]
    assert all(p.ndim == 3 and p.shape[0] > 50 for p in pictures)
    assert pictures[0].shape != pictures[2].shape or (pictures[0] != pictures[2]).any()   # each its own text


def test_one_text_draws_the_png_named(bert_onnx, tmp_path, capsys):
    assert main(["explain", str(bert_onnx), "-r", "gi", *TEXTS[:2], "--png", str(tmp_path / "e.png")]) == 0
    assert _listing(tmp_path) == ["e.png"]


@pytest.mark.parametrize("kind", ["json", "png"])
def test_generation_outputs_on_one_file_write_nothing(causal_lm, tmp_path, capsys, kind):
    _, path = causal_lm
    out = tmp_path / f"g.{kind}"
    assert main(["explain", str(path), "-r", "gi", "--generate", "2", "-t", "w1 w2", "--html", str(out),
                 f"--{kind}", str(out)]) == 2
    assert "both name" in capsys.readouterr().err and _listing(tmp_path) == []
