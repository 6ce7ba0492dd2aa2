"""`rulegraph explain MODEL --generate N --text PROMPT` (and `--continuation`) on tiny causal LMs
exported by `rulegraph export`: the terminal matrix, the JSON, HTML and PNG outputs, and a prompt
too long for the model refused in one line."""
from __future__ import annotations

import json

import matplotlib.image
import pytest

from rulegraph.cli import main

PROMPT = "w1 w2 w3 w4 w5"


def test_generate_writes_the_matrix_everywhere(causal_lm, tmp_path, capsys):
    _, path = causal_lm
    j, h, p = tmp_path / "g.json", tmp_path / "g.html", tmp_path / "g.png"
    code = main(["explain", str(path), "-r", "lrp-ah-ln", "--generate", "3", "-t", PROMPT,
                 "--json", str(j), "--html", str(h), "--png", str(p)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "generated token" in captured.out and "relevance of each row token" in captured.out
    d = json.loads(j.read_text())
    assert d["mode"] == "greedy" and [r.strip() for r in d["rows"][:5]] == PROMPT.split() and len(d["columns"]) == 3
    assert len(d["matrix"]) == 7 and d["matrix"][6][:2] == [None, None] and d["matrix"][6][2] is not None
    assert all(abs(s["relative_error"]) < 1e-4 for s in d["steps"])
    assert "<table>" in h.read_text() and d["columns"][0].strip() in h.read_text()
    image = matplotlib.image.imread(str(p))
    assert image.ndim == 3 and image.shape[0] > 50


def test_continuation_batched_equals_one_by_one(causal_lm, tmp_path, capsys):
    _, path = causal_lm
    docs = []
    for batch in ("1", "2"):
        out = tmp_path / f"c{batch}.json"
        assert main(["explain", str(path), "-r", "gi", "--continuation", "w7 w8 w9", "-t", PROMPT, "--dtype",
                     "float64", "--batch", batch, "--json", str(out)]) == 0, capsys.readouterr().err
        docs.append(json.loads(out.read_text()))
    assert [c.strip() for c in docs[0]["columns"]] == ["w7", "w8", "w9"] and [r.strip() for r in docs[0]["rows"][-2:]] == ["w7", "w8"]
    for a, b in zip(sum(docs[0]["matrix"], []), sum(docs[1]["matrix"], [])):
        assert (a is None and b is None) or abs(a - b) < 1e-10


def test_a_baseline_method(causal_lm, capsys):
    _, path = causal_lm
    assert main(["explain", str(path), "-m", "ig", "-o", "steps=4", "--generate", "2", "-t", PROMPT,
                 "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["method"] == "ig"


@pytest.mark.parametrize("argv, message", [
    (["--generate", "61"], "the prompt has 5 tokens and 61 generated tokens need 65 positions; the model takes at "
                           "most 64"),
    (["--continuation", " "], "--continuation is empty"),
    (["-m", "ig", "--score", "logprob", "--generate", "2"], "supported by rule sets; ig is a baseline"),
])
def test_bad_generation_input_is_one_line(causal_lm, argv, message, capsys):
    _, path = causal_lm
    rules = [] if "-m" in argv else ["-r", "gi"]
    code = main(["explain", str(path), *rules, "-t", PROMPT, *argv])
    output = " ".join((lambda c: c.out + c.err)(capsys.readouterr()).split())
    assert code == 2 and "Traceback" not in output
    assert message in output, output


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    import tiny
    folder = tmp_path_factory.mktemp("bart")
    path = tiny.seq2seq_onnx(tiny.seq2seq("bart"), folder / "model.onnx")
    tiny.tokenizer().save(str(folder / "tokenizer.json"))
    return path


SOURCE = "w5 w9 w14 w22"


def test_an_encoder_decoder_generates_and_writes_the_matrix(bart, tmp_path, capsys):
    """--generate on BART: the rows are the source then the target prefix (from the start token),
    the terminal shows each group's share, the JSON the matrix, the PNG the heatmap."""
    import tiny
    j, p = tmp_path / "g.json", tmp_path / "g.png"
    code = main(["explain", str(bart), "-r", "lrp-ah-ln", "--generate", "3", "-t", SOURCE, "--json", str(j),
                 "--png", str(p)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "source share" in captured.out and "target share" in captured.out
    d = json.loads(j.read_text())
    source = tiny.tokenizer().encode(SOURCE).tokens
    assert [r.strip() for r in d["rows"][:len(source)]] == source and len(d["rows"]) == len(source) + 3
    assert d["groups"] == ["source"] * len(source) + ["target"] * 3 and len(d["columns"]) == 3
    assert [a + b for a, b in zip(d["shares"]["source"], d["shares"]["target"])] == pytest.approx([1.0] * 3)
    assert matplotlib.image.imread(str(p)).ndim == 3


def test_the_deprecated_steps_flag_explains_the_given_prefix(bart, capsys):
    """`--steps` with -i decoder_input_ids: a warning, then the prefix's tokens after the start explained
    as --continuation does."""
    assert main(["explain", str(bart), "-r", "gi", "-t", SOURCE, "-i", "decoder_input_ids=3,40,41", "--steps",
                 "--dtype", "float64", "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert "--steps is deprecated" in captured.err
    d = json.loads(captured.out)
    assert d["mode"] == "continuation" and [s["token"] for s in d["steps"]] == [40, 41]


@pytest.mark.parametrize("extra, message", [
    (["--target", "5"], "--target does not apply"),
    (["--position", "1"], "--position does not apply"),
])
def test_what_generation_cannot_take_is_one_line(bart, capsys, extra, message):
    assert main(["explain", str(bart), "-r", "gi", "-t", SOURCE, "--generate", "2", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_span_is_the_last_column(causal_lm, tmp_path, capsys):
    _, path = causal_lm
    out = tmp_path / "span.json"
    assert main(["explain", str(path), "-r", "attnlrp", "--continuation", "w7 w8", "-t", PROMPT, "--span",
                 "--dtype", "float64", "--json", str(out), "--html", str(tmp_path / "span.html")]) == 0, \
        capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "the span" in printed and "Σ span" in printed
    d = json.loads(out.read_text())
    assert d["span"]["output_value"] == pytest.approx(sum(s["output_value"] for s in d["steps"]), abs=1e-12)
    assert "Σ span" in (tmp_path / "span.html").read_text()
    assert main(["explain", str(path), "-r", "gi", "-t", PROMPT, "--span"]) == 2
    assert "--span applies to --generate N or --continuation TEXT" in capsys.readouterr().err
