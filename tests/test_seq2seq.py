"""Encoder–decoder LMs (BART, T5, Marian; tiny, random weights), exported with the decoder's ids as
a graph input: the forward equals onnxruntime and the module, the boundary holds the decoder-side
token embeddings, `gi` equals autograd Gradient×Input on both embeddings, every shipped rule set
covers the graph and conserves at every generated step, and the per-step source-vs-prefix shares
(Yang et al. 2023, Sec. 4.2) sum to 1."""
from __future__ import annotations

import copy

import numpy as np
import onnxruntime
import pytest
import torch

import rulegraph
from rulegraph.boundary import lookups
import tiny
from rulegraph.cli import main
from rulegraph.errors import InputError
from rulegraph.seq2seq import Steps, explain_steps, greedy

# T5's torch.export program keeps an in-place add (aten.add_) the fx loader does not lower: ONNX only
CASES = [("bart", "torchscript"), ("t5", "torchscript"), ("marian", "torchscript"), ("t5", "dynamo"),
         ("marian", "torch.export")]


@pytest.fixture(scope="module", params=CASES, ids=["-".join(c) for c in CASES])
def exported(request, tmp_path_factory):
    name, exporter = request.param
    module = tiny.seq2seq(name)
    path = tiny.seq2seq_onnx(module, tmp_path_factory.mktemp(name) / "model.onnx", exporter=exporter)
    return name, module, path


def test_forward_equals_onnxruntime_and_the_module(exported):
    _, module, path = exported
    feeds = tiny.seq2seq_inputs(7, 4)
    graph = rulegraph.load(path)
    got = rulegraph.run(graph, feeds)[graph.outputs[0]]
    if path.suffix == ".onnx":
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        reference = session.run(None, {k: v.numpy() for k, v in feeds.items()})[0]
        np.testing.assert_allclose(got.numpy(), reference, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        expected = module(**feeds, use_cache=False).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_the_boundary_holds_the_decoder_token_embeddings(exported):
    _, _, path = exported
    sources = [lk.source for lk in lookups(rulegraph.load(path))]
    assert sources.count("input_ids") == 1 and sources.count("decoder_input_ids") == 1
    e = rulegraph.explain(path, "gi", tiny.seq2seq_inputs(7, 4), position=2)
    assert e.relevance["input_ids"].shape == (1, 7) and e.relevance["decoder_input_ids"].shape == (1, 4)


def test_gi_equals_autograd_gradient_times_input(exported):
    _, module, path = exported
    feeds = tiny.seq2seq_inputs(7, 4)
    position = 2
    e = rulegraph.explain(path, "gi", feeds, dtype=torch.float64, position=position)
    model = copy.deepcopy(module).double()
    embed = model.get_input_embeddings()
    source = embed(feeds["input_ids"]).detach().requires_grad_(True)
    prefix = embed(feeds["decoder_input_ids"]).detach().requires_grad_(True)
    logits = model(inputs_embeds=source, attention_mask=feeds["attention_mask"], decoder_inputs_embeds=prefix,
                   use_cache=False).logits
    logits[0, position, e.target[0]].backward()
    # the export holds float32 constants (T5's relative-position buckets, ε): agreement to ~1e-5 of the largest score
    for key, x in (("input_ids", source), ("decoder_input_ids", prefix)):
        reference = (x * x.grad).sum(-1).detach()
        torch.testing.assert_close(e.relevance[key], reference, rtol=1e-5, atol=1e-5 * float(reference.abs().max()))


@pytest.mark.parametrize("rules", sorted(rulegraph.shipped_rule_sets()))
def test_every_shipped_rule_set_covers_and_conserves_at_every_step(exported, rules, capsys):
    _, _, path = exported
    assert main(["check", str(path), "-r", rules]) == 0, capsys.readouterr().out
    steps = explain_steps(path, rules, tiny.seq2seq_inputs(5, 3), dtype=torch.float64)
    assert steps.scores.shape == (5 + 3, 3) and steps.sources == 5
    for t in range(3):
        rebuilt = float(steps.scores[:, t].sum()) + steps.absorbed[t] + steps.breaks[t]
        assert abs(steps.explained[t] - rebuilt) <= 1e-10 * abs(steps.explained[t])
        assert abs(steps.residual[t]) <= 1e-10 * abs(steps.explained[t])
        assert (steps.scores[5 + t + 1:, t] == 0).all()          # causal: the prefix after step t has none
    shares = steps.shares()
    defined = ~shares.isnan().any(0)
    assert defined.all()
    torch.testing.assert_close(shares.sum(0), torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-12)
    assert ((shares >= 0) & (shares <= 1)).all()


def test_decomposition_groups_the_source_and_the_prefix(exported):
    """Two groups over the rows source + prefix (Yang et al. 2023, Sec. 4.2): their contributions
    are the per-step sums of the per-token ones (signed α: Group Additivity), plus the bias = logit."""
    _, _, path = exported
    feeds = tiny.seq2seq_inputs(7, 4)
    tokens = explain_steps(path, "decomposition", feeds, dtype=torch.float64, alpha="signed")
    e = rulegraph.explain(path, "decomposition", feeds, dtype=torch.float64, alpha="signed", position=3,
                          target=tokens.targets[3], groups="source:7")
    groups = {g["label"]: g["score"] for g in e.extra["decomposition"]["groups"]}
    assert groups["source"] == pytest.approx(float(tokens.source[3]), rel=1e-9, abs=1e-12)
    assert groups["prefix"] == pytest.approx(float(tokens.prefix[3]), rel=1e-9, abs=1e-12)
    assert groups["source"] + groups["prefix"] + e.extra["decomposition"]["bias"] == \
        pytest.approx(e.output_value[0], rel=1e-10)


def test_greedy_prefix_gives_the_generated_tokens_as_the_default_targets(exported):
    name, module, path = exported
    feeds = tiny.seq2seq_inputs(7, 4)
    source = {k: feeds[k] for k in ("input_ids", "attention_mask")}
    start = module.config.decoder_start_token_id
    prefix, generated = greedy(path, source, 4, start)
    assert prefix[0, 0] == start and prefix[0, 1:].tolist() == generated[:-1]
    with torch.no_grad():                                      # the module, decoded step by step
        ids = torch.tensor([[start]])
        for _ in range(4):
            ids = torch.cat([ids, module(**source, decoder_input_ids=ids, use_cache=False).logits[:, -1:].argmax(-1)], 1)
    assert ids[0, 1:].tolist() == generated
    steps = explain_steps(path, "lrp-ah-ln", {**source, "decoder_input_ids": prefix}, labels=tiny.VOCAB.__getitem__)
    assert steps.targets == generated and steps.columns == [tiny.VOCAB[i] for i in generated]
    d = steps.to_dict()
    assert len(d["rows"]) == 11 and len(d["prefix_share"]) == 4


def test_shares_are_undefined_where_both_totals_are_zero():
    scores = torch.tensor([[1.0, 0.0, -3.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    steps = Steps(["a", "b", "c"], 2, ["x", "y", "z"], [0, 1, 2], scores, [0.0] * 3, [0.0] * 3, [0.0] * 3, [0.0] * 3)
    shares = steps.shares()
    assert shares[:, 0].tolist() == [0.5, 0.5]
    assert shares[:, 1].isnan().all()
    assert shares[:, 2].tolist() == [1.0, 0.0]
    assert steps.to_dict()["prefix_share"] == [0.5, None, 0.0]


def test_bad_inputs_are_one_line_errors(exported, tmp_path):
    _, _, path = exported
    with pytest.raises(InputError, match=r"one source and one prefix"):
        explain_steps(path, "gi", tiny.seq2seq_inputs(7, 4, batch=2))
    with pytest.raises(InputError, match="one per position"):
        explain_steps(path, "gi", tiny.seq2seq_inputs(7, 4), targets=[5, 6])
    with pytest.raises(InputError, match="target prefix"):
        explain_steps(path, "gi", {k: v for k, v in tiny.seq2seq_inputs().items() if k != "decoder_input_ids"})
    classifier = tiny.onnx(tiny.build("gpt2"), tmp_path / "gpt2.onnx", names=("input_ids", "attention_mask"))
    with pytest.raises(InputError, match="encoder–decoder export"):
        explain_steps(classifier, "gi", tiny.token_inputs(("input_ids", "attention_mask")))


def test_rulegraph_export_reads_the_task_off_the_config(tmp_path):
    """`rulegraph export` of a saved BART: task seq2seq-lm, the decoder's ids an input with its own axis."""
    module = tiny.seq2seq("bart")
    module.save_pretrained(tmp_path / "hf")
    tiny.tokenizer().save(str(tmp_path / "hf" / "tokenizer.json"))
    assert main(["export", str(tmp_path / "hf"), str(tmp_path / "out")]) == 0
    path = tmp_path / "out" / "model.onnx"
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert {i.name: i.shape for i in session.get_inputs()} == {
        "input_ids": ["batch", "sequence"], "attention_mask": ["batch", "sequence"],
        "decoder_input_ids": ["batch", "decoder_sequence"]}
    graph = rulegraph.load(path)
    assert graph.metadata["rulegraph.task"] == "seq2seq-lm" and "rulegraph.labels" not in graph.metadata
    feeds = tiny.seq2seq_inputs(6, 3)
    with torch.no_grad():
        expected = module(**feeds, use_cache=False).logits
    torch.testing.assert_close(rulegraph.run(graph, feeds)["logits"], expected, rtol=1e-4, atol=1e-5)
