"""Span QA: a tiny BERT ``ForQuestionAnswering`` (random weights) exported by ``rulegraph export``
(the task read off config.json), its start and end logits explained as targets (a token
position) in the API and the command line, and Precision@k against the answer span through
``rulegraph evaluate`` (CSV and JSON lines), checked against autograd Gradient×Input."""
from __future__ import annotations

import copy
import json

import numpy as np
import onnxruntime
import pytest
import torch

import rulegraph
import tiny
from rulegraph.cli import main

QUESTION, CONTEXT = "w5 w6", "w7 w8 w9 w10 w11 w12"
ROWS = [("w5 w6", "w7 w8 w9 w10 w11 w12", "w9 w10"), ("w20", "w21 w22 w23 w24", "w24"),
        ("w30 w31 w32", "w33 w34 w35 w36 w37 w38 w39", "w35 w36 w37")]


@pytest.fixture(scope="module")
def qa(tmp_path_factory):
    """The module (float64 copy) and `rulegraph export`'s model.onnx (tokenizer.json beside it)."""
    module = tiny.question_answering()
    root = tmp_path_factory.mktemp("qa")
    module.save_pretrained(root / "hf")
    tiny.tokenizer().save(str(root / "hf" / "tokenizer.json"))
    assert main(["export", str(root / "hf"), str(root / "out")]) == 0
    return copy.deepcopy(module).double(), root / "out" / "model.onnx"


def _feeds(question=QUESTION, context=CONTEXT):
    enc = tiny.tokenizer().encode(question, context)
    ids = torch.tensor([enc.ids])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.tensor([enc.type_ids])}


def _gi(module, feeds, output, position, types: bool = False):
    """Autograd Gradient×Input of one start/end logit at the word embeddings, per token (with
    ``types``, plus that at the token-type embeddings: the evaluation sums every boundary key)."""
    kept = []
    hook = module.bert.embeddings.token_type_embeddings.register_forward_hook(
        lambda _m, _i, out: kept.append(out) or out.retain_grad())
    embeddings = module.get_input_embeddings()(feeds["input_ids"]).detach().requires_grad_(True)
    out = module(inputs_embeds=embeddings, attention_mask=feeds["attention_mask"],
                 token_type_ids=feeds["token_type_ids"])
    hook.remove()
    getattr(out, output)[0, position].backward()
    scores = (embeddings * embeddings.grad).sum(-1)[0]
    if types:
        scores = scores + (kept[0] * kept[0].grad).sum(-1)[0]
    return scores.detach()


def test_export_writes_start_and_end_logits(qa):
    module, path = qa
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["start_logits", "end_logits"]
    assert rulegraph.load(path).metadata["rulegraph.task"] == "question-answering"
    feeds = _feeds()
    start, end = session.run(None, {k: v.numpy() for k, v in feeds.items()})
    with torch.no_grad():
        expected = module(**feeds)
    np.testing.assert_allclose(start, expected.start_logits.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(end, expected.end_logits.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("output", ["start_logits", "end_logits"])
def test_start_and_end_logits_are_targets_in_the_api(qa, output):
    module, path = qa
    e = rulegraph.explain(path, "gi", text=CONTEXT, question=QUESTION, output=output, target=6, dtype=torch.float64)
    assert e.output == output and e.target == [6] and e.tokens[0][:4] == ["[CLS]", "w5", "w6", "[SEP]"]
    reference = _gi(module, _feeds(), output, 6)
    torch.testing.assert_close(e.relevance["input_ids"][0], reference, rtol=1e-7, atol=1e-9)
    c = rulegraph.explain(path, "lrp-ah-ln", text=CONTEXT, question=QUESTION, output=output, dtype=torch.float64)
    assert c.target[0] == int(c.output_tensor[0].argmax())       # default: the predicted position
    assert abs(c.audit.conservation.relative_error) < 1e-10


def test_start_and_end_logits_are_targets_on_the_command_line(qa, capsys):
    module, path = qa
    capsys.readouterr()
    assert main(["explain", str(path), "-r", "gi", "--question", QUESTION, "-t", CONTEXT, "--output", "end_logits",
                 "--target", "7", "--dtype", "float64", "--json", "-"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["output"], d["target"]) == ("end_logits", 7)
    assert d["tokens"][3:5] == ["[SEP]", "w7"]
    np.testing.assert_allclose(d["relevance"]["input_ids"], _gi(module, _feeds(), "end_logits", 7).numpy(),
                               rtol=1e-7, atol=1e-9)
    assert main(["explain", str(path), "-r", "gi", "--question", QUESTION, "--output", "end_logits"]) == 2
    assert "give --text too" in capsys.readouterr().err


def _precision(module, question, context, answer, k):
    """Precision@k of autograd G×I for the predicted start: top-k non-special tokens in the answer."""
    enc = tiny.tokenizer().encode(question, context)
    feeds = _feeds(question, context)
    with torch.no_grad():
        position = int(module(**feeds).start_logits[0].argmax())
    scores = _gi(module, feeds, "start_logits", position, types=True).tolist()
    words = context.split()
    first = words.index(answer.split()[0])
    offset = enc.tokens.index("[SEP]") + 1
    span = set(range(offset + first, offset + first + len(answer.split())))
    candidates = [i for i, s in enumerate(enc.special_tokens_mask) if not s]
    top = sorted(candidates, key=lambda i: (-scores[i], i))[:k]
    return sum(i in span for i in top) / len(top)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_precision_at_k_through_evaluate(qa, tmp_path, suffix):
    module, path = qa
    data = tmp_path / f"qa{suffix}"
    if suffix == ".csv":
        data.write_text("question,context,answer\n" + "".join(f"{q},{c},{a}\n" for q, c, a in ROWS))
    else:
        data.write_text("".join(json.dumps({"question": q, "context": c, "answer": a}) + "\n" for q, c, a in ROWS))
    out = tmp_path / "run"
    assert main(["evaluate", str(path), "--data", str(data), "--methods", "gi", "--metrics", "precision@k",
                 "--precision-k", "2", "--dtype", "float64", "--out", str(out), "--quiet"]) == 0
    rows = sorted((json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()),
                  key=lambda r: r["example"])
    got = [r["metrics"]["precision@k"] for r in rows]
    assert got == pytest.approx([_precision(module, q, c, a, 2) for q, c, a in ROWS])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["table"]["gi"]["precision@k"]["mean"] == pytest.approx(sum(got) / len(got))
