"""Calibration finds a planted positional head (block 0, head 0 attends to the previous token),
with and without spaCy; words align to subwords by character offsets."""
from __future__ import annotations

import math
import warnings

import pytest
import torch

import rulegraph
import tiny
from rulegraph.calibrate import arcs_of, calibrate
from rulegraph.text import TextEncoder


def _planted(tmp_path):
    model = tiny.build("bert")
    emb = model.bert.embeddings
    with torch.no_grad():
        emb.word_embeddings.weight.zero_()
        emb.token_type_embeddings.weight.zero_()
        emb.position_embeddings.weight.zero_()
        theta = 0.5
        for i in range(emb.position_embeddings.weight.shape[0]):
            emb.position_embeddings.weight[i, 0] = math.cos(theta * i)
            emb.position_embeddings.weight[i, 1] = math.sin(theta * i)
        attn = model.bert.encoder.layer[0].attention.self
        for lin in (attn.query, attn.key):
            lin.weight[:8].zero_()
            lin.bias[:8].zero_()
        c, s = math.cos(theta), math.sin(theta)      # q_i = R(−θ)·h_i, k_j = h_j: q_i·k_j peaks at j = i − 1
        attn.query.weight[0, 0], attn.query.weight[0, 1] = 40 * c, 40 * s
        attn.query.weight[1, 0], attn.query.weight[1, 1] = -40 * s, 40 * c
        attn.key.weight[0, 0] = attn.key.weight[1, 1] = 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = tiny.onnx(model, tmp_path / "model.onnx")
    tiny.tokenizer().save(str(tmp_path / "tokenizer.json"))
    return path


TEXTS = [" ".join(f"w{(7 * i + 3 * k) % 90}" for k in range(5 + i % 6)) for i in range(24)]


def test_planted_positional_head_is_found(tmp_path):
    path = _planted(tmp_path)
    graph = rulegraph.load(path)
    cal = calibrate(graph, TextEncoder(tmp_path / "tokenizer.json"), TEXTS, batch=8)
    offset, alpha = cal.positional[0][0]
    assert offset == -1 and alpha > 0.8
    assert cal.types[0][0] == "positional" and cal.syntactic is None
    assert cal.texts == len(TEXTS) and cal.tokens == sum(len(t.split()) + 2 for t in TEXTS)

    from click.testing import CliRunner
    from rulegraph.cli import cli
    data = tmp_path / "data.csv"
    data.write_text("text\n" + "\n".join(TEXTS) + "\n")
    out = tmp_path / "masks.yaml"
    result = CliRunner().invoke(cli, ["heads", "calibrate", str(path), "--data", str(data), "--n", "24", "--out",
                                      str(out), "--png", str(tmp_path / "h.png"), "--no-syntax", "-q"])
    assert result.exit_code == 0, result.output
    assert "positional heads only" in result.output
    from rulegraph.heads import read_masks
    assert read_masks(out).types[0][0] == "positional"
    assert (tmp_path / "h.png").stat().st_size > 1000


def test_words_align_to_subwords_by_offsets():
    pytest.importorskip("spacy")
    from rulegraph.calibrate import load_parser
    parser, why = load_parser()
    if parser is None:
        pytest.skip(why)
    text = "The unbelievably good car is red."
    # a WordPiece-like split: [CLS] the un ##believ ##ably good car is red . [SEP]
    offsets = [(0, 0), (0, 3), (4, 6), (6, 12), (12, 16), (17, 21), (22, 25), (26, 28), (29, 32), (32, 33), (0, 0)]
    special = [True] + [False] * 9 + [True]
    arcs = arcs_of(parser(text), offsets, special)
    by_relation = {rel: (gov, dep) for rel, gov, dep in arcs}
    assert by_relation["advmod"] == (5, [2, 3, 4])      # good → unbelievably (three subwords)
    assert by_relation["amod"] == (6, [5])              # car → good
    assert by_relation["nsubj"][1] == [6]               # … → car
