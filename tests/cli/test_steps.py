"""``rulegraph explain --steps`` on a tiny BART export: the JSON matrix equals the API's
(rulegraph.seq2seq.explain_steps), the terminal shows the prefix share per generated token, and
what --steps cannot take is a one-line error."""
from __future__ import annotations

import json

import pytest
import torch

import tiny
from rulegraph.cli import main
from rulegraph.seq2seq import explain_steps


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bart")
    path = tiny.seq2seq_onnx(tiny.seq2seq("bart"), folder / "model.onnx")
    tiny.tokenizer().save(str(folder / "tokenizer.json"))
    return path


SOURCE, PREFIX = "w5 w9 w14 w22", [3, 40, 41]


def test_steps_json_is_the_api_matrix(bart, capsys):
    capsys.readouterr()
    assert main(["explain", str(bart), "-r", "lrp-ah-ln", "-t", SOURCE, "-i",
                 "decoder_input_ids=" + ",".join(map(str, PREFIX)), "--steps", "--dtype", "float64",
                 "--json", "-"]) == 0
    d = json.loads(capsys.readouterr().out)
    enc = tiny.tokenizer().encode(SOURCE)
    ids = torch.tensor([enc.ids])
    steps = explain_steps(bart, "lrp-ah-ln", {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                              "decoder_input_ids": torch.tensor([PREFIX])}, dtype=torch.float64)
    assert d["rows"] == enc.tokens + [tiny.VOCAB[i] for i in PREFIX] and d["sources"] == len(enc.tokens)
    assert d["targets"] == steps.targets and d["columns"] == [tiny.VOCAB[i] for i in steps.targets]
    torch.testing.assert_close(torch.tensor(d["scores"], dtype=torch.float64), steps.scores, rtol=0, atol=1e-12)
    assert [a + b for a, b in zip(d["source_share"], d["prefix_share"])] == pytest.approx([1.0] * len(PREFIX))


def test_steps_table_in_the_terminal(bart, capsys):
    capsys.readouterr()
    assert main(["explain", str(bart), "-r", "decomposition", "-t", SOURCE, "-i", "decoder_input_ids=3,40",
                 "--steps"]) == 0
    text = capsys.readouterr().out
    assert "prefix share" in text and "residual" in text and "%" in text


@pytest.mark.parametrize("extra, message", [
    (["--target", "5"], "no --target"),
    (["--position", "1"], "no --position"),
])
def test_what_steps_cannot_take_is_one_line(bart, capsys, extra, message):
    capsys.readouterr()
    assert main(["explain", str(bart), "-r", "gi", "-t", SOURCE, "-i", "decoder_input_ids=3,40", "--steps",
                 *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_steps_with_a_method_is_refused(bart, capsys):
    assert main(["explain", str(bart), "-m", "random", "-t", SOURCE, "-i", "decoder_input_ids=3,40", "--steps"]) == 2
    assert "with a rule set (--rules), not a --method" in capsys.readouterr().err
