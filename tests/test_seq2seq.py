"""Encoder–decoder LMs (BART, T5, Marian; tiny, random weights), exported with the decoder's ids as
a graph input: the forward equals onnxruntime and the module, the boundary holds the decoder-side
token embeddings, `gi` equals autograd Gradient×Input on both embeddings, every shipped rule set
covers the graph and conserves at every generated step, and the per-step source-vs-prefix shares
(Yang et al. 2023, Sec. 4.2) sum to 1 — all through :func:`rulegraph.generate`, as for
decoder-only models."""
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
from rulegraph.errors import InputError, ModelError
from rulegraph.generation import GeneratedToken, Generation
from rulegraph.methods import names as method_names

# T5 in memory (its torch.export program functionalized): test_t5_in_memory_equals_its_onnx_export
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


def prefixed(module, source: int = 5, target: int = 3, **kw) -> dict[str, torch.Tensor]:
    """Source ids and a target prefix that starts with the decoder's start token."""
    feeds = tiny.seq2seq_inputs(source, target, **kw)
    feeds["decoder_input_ids"][:, 0] = module.config.decoder_start_token_id
    return {"input_ids": feeds["input_ids"], "decoder_input_ids": feeds["decoder_input_ids"]}


@pytest.mark.parametrize("rules", sorted(rulegraph.shipped_rule_sets()))
def test_every_shipped_rule_set_covers_and_conserves_at_every_step(exported, rules, capsys):
    _, module, path = exported
    assert main(["check", str(path), "-r", rules]) == 0, capsys.readouterr().out
    g = rulegraph.generate(path, rules, inputs=prefixed(module, 5, 4), dtype=torch.float64)
    assert g.groups == ["source"] * 5 + ["target"] * 3 and g.matrix.shape == (5 + 3, 3)
    for t, step in enumerate(g.steps):
        assert step.position == t and len(step.scores) == 5 + t + 1
        rebuilt = sum(step.scores) + step.absorbed + step.breaks
        assert abs(step.output_value - rebuilt) <= 1e-10 * abs(step.output_value)
        assert abs(step.residual) <= 1e-10 * abs(step.output_value)
    shares = g.shares()
    total = shares["source"] + shares["target"]
    torch.testing.assert_close(total, torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-12)
    assert all(((s >= 0) & (s <= 1)).all() for s in shares.values())


def test_the_prefix_after_a_step_gets_no_relevance(exported):
    """A causal decoder: explained at position t, the prefix rows after t hold exactly 0."""
    _, module, path = exported
    feeds = prefixed(module, 5, 4)
    e = rulegraph.explain(path, "lrp-ah-ln", {**feeds, "attention_mask": torch.ones_like(feeds["input_ids"])},
                          position=1, dtype=torch.float64)
    assert (e.relevance["decoder_input_ids"][0, 2:] == 0).all()


def test_decomposition_groups_the_source_and_the_prefix(exported):
    """Two groups over the rows source + prefix (Yang et al. 2023, Sec. 4.2): their contributions
    are the per-step sums of the per-token ones (signed α: Group Additivity), plus the bias = logit."""
    _, module, path = exported
    feeds = prefixed(module, 7, 5)
    g = rulegraph.generate(path, "decomposition", inputs=feeds, dtype=torch.float64, alpha="signed")
    full = {**feeds, "attention_mask": torch.ones_like(feeds["input_ids"])}
    e = rulegraph.explain(path, "decomposition", full, dtype=torch.float64, alpha="signed", position=3,
                          target=g.steps[3].token, groups="source:7")
    groups = {x["label"]: x["score"] for x in e.extra["decomposition"]["groups"]}
    totals = g.totals()
    assert groups["source"] == pytest.approx(float(totals["source"][3]), rel=1e-9, abs=1e-12)
    assert groups["prefix"] == pytest.approx(float(totals["target"][3]), rel=1e-9, abs=1e-12)
    assert groups["source"] + groups["prefix"] + e.extra["decomposition"]["bias"] == \
        pytest.approx(e.output_value[0], rel=1e-10)


def test_greedy_generation_equals_the_module_decoding_step_by_step(exported):
    name, module, path = exported
    source = tiny.seq2seq_inputs(7, 4)["input_ids"]
    g = rulegraph.generate(path, "lrp-ah-ln", inputs={"input_ids": source}, max_new_tokens=4)
    start = module.config.decoder_start_token_id
    with torch.no_grad():                                      # the module, decoded step by step
        ids = torch.tensor([[start]])
        for _ in range(4):
            logits = module(input_ids=source, attention_mask=torch.ones_like(source), decoder_input_ids=ids,
                            use_cache=False).logits
            ids = torch.cat([ids, logits[:, -1:].argmax(-1)], 1)
    assert [s.token for s in g.steps] == ids[0, 1:].tolist() and g.mode == "greedy"
    assert g.rows[7] == str(start) and g.groups == ["source"] * 7 + ["target"] * 4
    d = g.to_dict()
    assert len(d["rows"]) == 11 and len(d["shares"]["target"]) == 4


def test_a_given_prefix_equals_its_continuation(exported):
    """The prefix given as decoder_input_ids explains the tokens after the start, as continuation= does."""
    _, module, path = exported
    feeds = prefixed(module, 5, 4)
    by_prefix = rulegraph.generate(path, "gi", inputs=feeds, dtype=torch.float64)
    by_continuation = rulegraph.generate(path, "gi", inputs={"input_ids": feeds["input_ids"]}, dtype=torch.float64,
                                         continuation=feeds["decoder_input_ids"][0, 1:].tolist(), batch=2)
    assert by_prefix.rows == by_continuation.rows
    torch.testing.assert_close(by_prefix.matrix, by_continuation.matrix, rtol=0, atol=1e-12, equal_nan=True)


def test_shares_are_undefined_where_every_total_is_zero():
    scores = [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [-3.0, 0.0, 0.0]]           # rows a, b | c; three steps
    steps = [GeneratedToken(token=k, text=x, position=0, output_value=0.0, probability=1.0,
                            scores=[row[k] for row in scores]) for k, x in enumerate("xyz")]
    g = Generation(["a", "b", "c"], ["source", "source", "target"], steps, "gi", "continuation")
    shares = g.shares()
    assert shares["source"].tolist()[0] == 0.25 and shares["target"].tolist()[0] == 0.75
    assert shares["source"][1].isnan() and shares["target"][1].isnan()
    assert shares["source"].tolist()[2] == 1.0
    assert g.to_dict()["shares"]["target"] == [0.75, None, 0.0]


def test_bad_inputs_are_one_line_errors(exported, tmp_path):
    _, module, path = exported
    feeds = prefixed(module, 7, 4)
    with pytest.raises(InputError, match=r"integer token ids of shape \[1, length\]"):
        rulegraph.generate(path, "gi", inputs=prefixed(module, 7, 4, batch=2))
    with pytest.raises(InputError, match="must start with the decoder start token"):
        rulegraph.generate(path, "gi", inputs={**feeds, "decoder_input_ids": feeds["decoder_input_ids"][:, 1:] + 1})
    with pytest.raises(InputError, match="not both"):
        rulegraph.generate(path, "gi", inputs=feeds, max_new_tokens=2)
    unrecorded = tmp_path / "unrecorded.onnx"
    import onnx
    model = onnx.load(str(path)) if path.suffix == ".onnx" else None
    if model is not None:
        keep = [p for p in model.metadata_props if p.key != "rulegraph.decoder_start_token_id"]
        del model.metadata_props[:]
        model.metadata_props.extend(keep)
        onnx.save(model, str(unrecorded))
        with pytest.raises(ModelError, match="does not record its decoder start token"):
            rulegraph.generate(unrecorded, "gi", inputs={"input_ids": feeds["input_ids"]}, max_new_tokens=2)
    classifier = tiny.onnx(tiny.build("gpt2"), tmp_path / "gpt2.onnx", names=("input_ids", "attention_mask"))
    with pytest.raises(InputError, match="encoder–decoder's input"):
        rulegraph.generate(classifier, "gi", inputs=feeds)


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


def test_t5_in_memory_equals_its_onnx_export(tmp_path):
    """A T5 module in memory: its torch.export program keeps an in-place add (the relative-position
    buckets), functionalized before lowering; each explained step then equals the ONNX export's."""
    module = tiny.seq2seq("t5")
    path = tiny.seq2seq_onnx(module, tmp_path / "model.onnx")
    feeds = prefixed(module, 5, 4)
    memory = rulegraph.generate(module, "attnlrp", inputs=feeds, dtype=torch.float64)
    exported = rulegraph.generate(path, "attnlrp", inputs=feeds, dtype=torch.float64)
    assert memory.rows == exported.rows and [s.token for s in memory.steps] == [s.token for s in exported.steps]
    # the export holds float32 constants (the relative-position buckets, ε): agreement to ~1e-5 of the largest
    scale = float(torch.nan_to_num(exported.matrix).abs().max())
    torch.testing.assert_close(memory.matrix, exported.matrix, rtol=1e-5, atol=1e-5 * scale, equal_nan=True)
    assert all(abs(s.residual) <= 1e-10 * abs(s.output_value) for s in memory.steps)       # conserved
    greedy = rulegraph.generate(module, "attnlrp", text="w1 w2 w3", max_new_tokens=2, tokenizer=tiny.lm_tokenizer(),
                                ignore_eos=True)
    assert len(greedy.steps) == 2 and [r.strip() for r in greedy.rows[:3]] == ["w1", "w2", "w3"]


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    module = tiny.seq2seq("bart")
    return module, tiny.seq2seq_onnx(module, tmp_path_factory.mktemp("bart_methods") / "model.onnx")


#: methods that score the source only (no target-prefix rows), need what ids do not give (the
#: tokenizer's [MASK], a masks file), are CNN rule sets, or multiply attention maps over one token
#: sequence (an encoder–decoder has self- and cross-attention): generate refuses them in one line
REFUSED = {"random", "gs", "attention", "lat", "loo", "mask-lrp-random", "epsilon-gamma-box", "epsilon-plus-flat",
           "rollout", "gae", "layer-saliency", "mask-lrp-rollout"}


@pytest.mark.parametrize("method", method_names())
def test_every_method_explains_step_k_as_explain_does_on_its_prefix(bart, method):
    """An encoder–decoder's step k, for every registered method, equals explain on the source and the
    target prefix up to k (its last position), in float64; a method that cannot give a generation's
    rows is refused in one line."""
    module, path = bart
    feeds = prefixed(module, 5, 4)
    options = {"steps": 4} if method == "ig" else {}
    try:
        g = rulegraph.generate(path, method, inputs=feeds, dtype=torch.float64, **options)
    except rulegraph.RulegraphError as refused:
        assert method in REFUSED, refused
        assert "\n" not in str(refused)
        return
    assert method not in REFUSED and len(g.steps) == 3
    source = feeds["input_ids"]
    for k, step in enumerate(g.steps):
        e = rulegraph.explain(path, method, {"input_ids": source, "attention_mask": torch.ones_like(source),
                                             "decoder_input_ids": feeds["decoder_input_ids"][:, :k + 1]},
                              target=step.token, dtype=torch.float64, **options)
        assert step.output_value == pytest.approx(e.output_value[0], abs=1e-12)
        expected = torch.cat([e.relevance["input_ids"][0], e.relevance["decoder_input_ids"][0]]).double()
        torch.testing.assert_close(torch.tensor(step.scores, dtype=torch.float64), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", ["rollout", "gae", "lat", "layer-saliency", "mask-lrp-rollout"])
def test_attention_products_refuse_an_encoder_decoder_in_one_line(bart, method):
    """Rollout-style methods multiply every block's map over one sequence; an encoder–decoder's maps
    (source × source, target × target, target × source) cannot be multiplied: refused, naming what works."""
    _, path = bart
    with pytest.raises(rulegraph.RulegraphError, match="attnlrp") as refused:
        rulegraph.explain(path, method, tiny.seq2seq_inputs(), dtype=torch.float64)
    assert "\n" not in str(refused.value)
