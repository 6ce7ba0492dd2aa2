"""Relevance inside the model (rulegraph.inside): at selected values, per position and unit, and
conditioned on chosen units (CRP, Achtibat et al. 2023), in float64 on tiny models."""
from __future__ import annotations

import json

import pytest
import torch

import cnn
import rulegraph
from rulegraph.errors import InputError
from rulegraph.heads import find_heads
from rulegraph.inside import MAX_MAPS, MAX_VALUES, SITES, parse, parse_condition
from rulegraph.passes import relevance
from shell import rulegraph as run_cli
from targets import same

F64 = torch.float64
TEXT = "the cat sat on the mat"
TIGHT = 1e-10


def explain(model, rules="attnlrp", **kw):
    return rulegraph.explain(model, rules, text=TEXT, dtype=F64, **kw)


def close(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference relative to the larger map's largest element."""
    return float((a - b).abs().max() / max(a.abs().max(), b.abs().max(), 1e-300))


# --- the selector grammar

def test_a_selector_reads_blocks_sites_keys_and_names():
    s = parse("every block 0-1,3 MLP activation")
    assert (s.blocks, s.site) == (frozenset({0, 1, 3}), "mlp activation")
    s = parse("block 2 op Softmax,MatMul")
    assert (s.blocks, s.key, s.globs) == (frozenset({2}), "op", ("Softmax", "MatMul"))
    assert parse("scope *.intermediate.dense").key == "scope"
    assert parse("/model/classifier/Gemm").name == "/model/classifier/Gemm"
    assert parse("every attention output").blocks is None
    with pytest.raises(InputError, match="after the blocks"):
        parse("block 3")
    selector, choice = parse_condition("block 1 attention output:heads=0,2-3")
    assert (selector.site, choice.kind, choice.alternatives) == ("attention output", "heads", ((0, 2, 3),))
    assert parse_condition("op Conv:channels=none")[1].alternatives == ((),)
    assert parse_condition("op Conv:channels=0|1,3|none")[1].alternatives == ((0,), (1, 3), ())
    assert parse_condition("op Conv:channels=each")[1].alternatives is None
    for bad in ("block 1 attention output", "op Conv:rows=1", "op Conv:heads=a"):
        with pytest.raises(InputError):
            parse_condition(bad)


# --- BERT: at a node, per head and unit

@pytest.fixture(scope="module")
def bert_at(bert_onnx):
    return explain(bert_onnx, at=["block 1 attention output", "every MLP activation", "block output"])


def test_attention_output_splits_heads_and_sums_to_its_ledger_entry(bert_onnx, bert_at):
    graph = rulegraph.load(bert_onnx)
    heads = {b.block: b.heads for b in find_heads(graph)}
    (x,) = bert_at.at("block 1 attention output")
    assert x.block == 1 and x.axes == ("batch", "position", "head", "dim") and f"× {heads[1]} head ×" in repr(x)
    assert x.relevance.shape[:3] == (1, len(bert_at.scores()), heads[1])
    # the relevance at the value is the sum over its units, and what the audit booked arriving at its producer
    producer = next(n for n in bert_at.audit.nodes if n.name == x.node)
    assert float(x.per_unit().sum()) == pytest.approx(float(x.total()[0]), abs=1e-15)
    assert float(x.per_position().sum()) == pytest.approx(float(x.total()[0]), abs=1e-15)
    assert float(x.total()[0]) == pytest.approx(producer.relevance_in, rel=TIGHT, abs=1e-15)
    assert all(x.block == b for x, b in zip(bert_at.at("every MLP activation"), (0, 1)))
    assert bert_at.at("every MLP activation")[0].axes == ("batch", "position", "unit")


def test_a_block_output_holds_the_output_less_what_was_absorbed_after_it(bert_at):
    """The residual stream is a cut: all relevance reaching the inputs passes it; what it holds is the
    explained value less what the nodes after it absorbed or broke (the ledger's own figures)."""
    nodes = [n for n in bert_at.audit.nodes if n.rule != "boundary"]
    output = bert_at.audit.conservation.output_value
    for x in bert_at.at("block output"):
        k = next(i for i, n in enumerate(nodes) if n.name == x.node)       # walk order: the nodes after it first
        after = sum(n.absorbed + n.breaks for n in nodes[:k])
        assert float(x.total()[0]) == pytest.approx(output - after, rel=TIGHT, abs=TIGHT * abs(output))


def test_conditioning_on_every_unit_is_the_unconditioned_map(bert_onnx, bert_at):
    key = next(iter(bert_at.boundary))
    for condition in ("block 1 attention output:heads=0-3", "block output:units=0-31"):
        e = explain(bert_onnx, condition=condition)
        assert close(e.boundary[key], bert_at.boundary[key]) <= TIGHT
        assert e.extra["condition"]["absorbed"] == pytest.approx(0.0, abs=1e-15)


def test_disjoint_conditions_on_a_cut_sum_to_the_unconditioned_map(bert_onnx, bert_at):
    key = next(iter(bert_at.boundary))
    parts = [explain(bert_onnx, condition=f"block 0 block output:units={u}", at="block 0 block output")
             for u in ("0-9", "10-31")]
    assert close(parts[0].boundary[key] + parts[1].boundary[key], bert_at.boundary[key]) <= TIGHT
    # the audit still adds up: what the condition masked out is booked as absorbed where it was masked
    whole = bert_at.at("block output")[0].total()[0]
    for e in parts:
        c = e.audit.conservation
        assert abs(c.residual) <= TIGHT * abs(c.output_value)
        kept = e.at()[0].total()[0]
        assert float(kept) == pytest.approx(float(whole) - e.extra["condition"]["absorbed"], rel=TIGHT)
        assert c.input_total != pytest.approx(bert_at.audit.conservation.input_total, rel=1e-6)


def test_heads_off_the_residual_path_add_up_with_the_bypass_counted_once(bert_onnx, bert_at):
    """An attention output is not a cut (the residual bypasses it): each conditioned map keeps the bypass,
    which ``heads=none`` alone leaves, so the maps of disjoint head sets, less the bypass once per extra set,
    are the unconditioned map."""
    key = next(iter(bert_at.boundary))
    maps = {h: explain(bert_onnx, condition=f"block 1 attention output:heads={h}").boundary[key]
            for h in ("0,2", "1,3", "none")}
    assert close(maps["0,2"] + maps["1,3"] - maps["none"], bert_at.boundary[key]) <= TIGHT
    assert close(maps["0,2"], maps["none"]) > 1e-6


@pytest.fixture
def walks(monkeypatch):
    """The batched walks run (each a list of how many seeds it carried)."""
    seen: list[int] = []
    group = relevance._walk_group
    monkeypatch.setattr(relevance, "_walk_group", lambda *a, **k: seen.append(len(a[4])) or group(*a, **k))
    return seen


def test_alternatives_are_maps_of_one_walk_each_equal_to_its_own_condition(bert_onnx, bert_at, walks):
    """``units=0-9|10-31`` on a cut: two maps from one forward and one batched walk, each equal to its
    condition given alone (float64, 1e-12, audit included), summing to the unconditioned map."""
    key = next(iter(bert_at.boundary))
    maps = explain(bert_onnx, condition="block 0 block output:units=0-9|10-31", at="block 0 block output")
    assert walks == [2] and len(maps) == 2
    for e, units in zip(maps, ("0-9", "10-31")):
        alone = explain(bert_onnx, condition=f"block 0 block output:units={units}", at="block 0 block output")
        same(e, alone)
        assert e.extra["condition"]["conditions"] == alone.extra["condition"]["conditions"]
        assert e.extra["condition"]["absorbed"] == pytest.approx(alone.extra["condition"]["absorbed"], abs=1e-12)
        assert close(e.at()[0].relevance, alone.at()[0].relevance) <= 1e-12
    assert close(maps[0].boundary[key] + maps[1].boundary[key], bert_at.boundary[key]) <= TIGHT


def test_each_head_and_each_target_in_one_walk(bert_onnx, walks):
    """``heads=each`` with ``targets``: a map per (target, head), target by target, from one walk."""
    maps = explain(bert_onnx, condition="block 1 attention output:heads=each", targets="all")
    heads = 4
    assert walks == [2 * heads] and len(maps) == 2 * heads
    assert [e.target[0] for e in maps] == [0] * heads + [1] * heads
    assert [e.extra["condition"]["conditions"] for e in maps[:heads]] == \
        [[f"block 1 attention output:heads={h}"] for h in range(heads)]
    for e in maps[heads - 1:heads + 1]:
        same(e, explain(bert_onnx, condition=e.extra["condition"]["conditions"][0], target=e.target[0]))


def test_each_maps_page_names_its_condition(bert_onnx):
    """The HTML of several maps (a notebook's view, ``to_html``) says which units each map kept."""
    maps = explain(bert_onnx, condition="block 1 attention output:heads=0|1,2")
    page = maps.to_html()
    for e, units in zip(maps, ("0", "1,2")):
        absorbed = e.extra["condition"]["absorbed"]
        assert f"conditioned on <code>block 1 attention output:heads={units}</code>; {absorbed:+.4g} masked out" in page
    assert maps._repr_html_().count("conditioned on <code>") == 2
    masked = maps[0].extra["condition"]["absorbed"]
    assert f"went to the units the condition masked out ({masked:+.3g}) and biases" in page


def test_the_maps_are_bounded_and_each_needs_one_count(bert_onnx):
    many = "|".join(str(u) for u in range(MAX_MAPS + 1))
    with pytest.raises(InputError, match=f"{MAX_MAPS + 1} alternatives; the limit is {MAX_MAPS} maps"):
        explain(bert_onnx, condition=f"block output:units={many}")
    with pytest.raises(InputError, match=f"the conditions make 96 maps; the limit is {MAX_MAPS}"):
        explain(bert_onnx, condition=["block 0 block output:units=" + "|".join(map(str, range(12))),
                                      "block 1 attention output:heads=0|1|2|3|0,1|2,3|none|0-3"])
    with pytest.raises(InputError, match="heads 4 is out of range; it has 4 heads"):
        explain(bert_onnx, condition="block 1 attention output:heads=0|4")


def test_bad_selectors_and_conditions_are_refused_naming_the_choices(bert_onnx):
    with pytest.raises(InputError, match=r"selects no value.*blocks 0–1.*attention output"):
        explain(bert_onnx, at="block 7 attention output")
    with pytest.raises(InputError, match="no op trait 'activatoin'; did you mean 'activation'"):
        explain(bert_onnx, at="trait activatoin")
    with pytest.raises(InputError, match="the graph's ops: .*LayerNormalization"):
        explain(bert_onnx, at="op Conv")
    with pytest.raises(InputError, match=f"at most {MAX_VALUES}"):
        explain(bert_onnx, at="op *")
    with pytest.raises(InputError, match="heads= needs an attention output"):
        explain(bert_onnx, condition="block 1 MLP activation:heads=0")
    with pytest.raises(InputError, match=r"heads 4 is out of range; it has 4 heads \(0…3\)"):
        explain(bert_onnx, condition="block 1 attention output:heads=4")
    with pytest.raises(InputError, match="was not asked for"):
        explain(bert_onnx, at="block output").at("every MLP activation")
    with pytest.raises(InputError, match="which a generation's steps do not keep"):
        rulegraph.generate(bert_onnx, "attnlrp", text=TEXT, max_new_tokens=1, at="block output")
    assert set(SITES.names()) == {"attention output", "mlp activation", "block output"}


# --- GPT-2: heads of every block, conditioned in one walk

@pytest.mark.parametrize("causal_lm", ["gpt2"], indirect=True)
def test_a_causal_lm_splits_every_blocks_heads(causal_lm):
    _, path = causal_lm
    e = explain(path, at="every attention output")
    found = e.at()
    heads = find_heads(rulegraph.load(path))
    assert [x.block for x in found] == [b.block for b in heads]
    assert all(x.heads == b.heads for x, b in zip(found, heads))
    for x in found:
        assert x.relevance.shape[2] == x.heads
        assert float(x.per_unit().sum()) == pytest.approx(float(x.total()[0]), rel=TIGHT, abs=1e-15)
    # every head of every block conditioned at once is the unconditioned map; no head, another one
    key = next(iter(e.boundary))
    n = heads[0].heads
    every = explain(path, condition=f"every attention output:heads=0-{n - 1}")
    assert close(every.boundary[key], e.boundary[key]) <= TIGHT
    bypass = explain(path, condition="every attention output:heads=none")
    assert close(bypass.boundary[key], e.boundary[key]) > 1e-6
    unaudited = explain(path, condition="every attention output:heads=none", audit=False)
    assert torch.equal(unaudited.boundary[key], bypass.boundary[key])
    assert unaudited.extra["condition"]["absorbed"] is None
    assert abs(bypass.audit.conservation.residual) <= TIGHT * abs(bypass.audit.conservation.output_value)


# --- a CNN: channel-wise conditional maps (CRP's setting)

@pytest.fixture(scope="module")
def cnn_model(tmp_path_factory):
    x = cnn.image(batch=1)
    return cnn.onnx(cnn.build("cnn"), tmp_path_factory.mktemp("cnn") / "model.onnx", x), x


def test_channel_conditions_on_a_convolution_sum_to_the_map(cnn_model):
    path, x = cnn_model
    full = rulegraph.explain(path, "epsilon", {"pixel_values": x}, dtype=F64, at="op Conv")
    convs = full.at()
    assert [c.axes for c in convs] == [("batch", "channel", "row", "column")] * 3
    assert [c.per_unit().shape[1] for c in convs] == [4, 6, 5]
    # a plain CNN's layers are cuts: each holds the output less what the nodes after it absorbed or broke
    nodes = [n for n in full.audit.nodes if n.rule != "boundary"]
    output = full.audit.conservation.output_value
    for c in convs:
        k = next(i for i, n in enumerate(nodes) if n.name == c.node)
        after = sum(n.absorbed + n.breaks for n in nodes[:k])
        assert float(c.total()[0]) == pytest.approx(output - after, rel=TIGHT, abs=TIGHT * abs(output))
    second = convs[1].node
    maps = [rulegraph.explain(path, "epsilon", {"pixel_values": x}, dtype=F64,
                              condition=f"name {second}:channels={c}").boundary["pixel_values"] for c in range(6)]
    assert close(sum(maps), full.boundary["pixel_values"]) <= TIGHT
    # each channel's map holds what reached that channel (the walk below a convolution conserves up to ε)
    assert all(float(m.abs().sum()) > 0 for m in maps)


def test_each_channel_of_a_convolution_in_one_walk_sums_to_the_map(cnn_model, walks):
    """CRP's channel-wise maps (``channels=each``) from one batched walk: each equals its channel alone."""
    path, x = cnn_model
    full = rulegraph.explain(path, "epsilon", {"pixel_values": x}, dtype=F64, at="op Conv")
    second = full.at()[1].node
    maps = rulegraph.explain(path, "epsilon", {"pixel_values": x}, dtype=F64, condition=f"name {second}:channels=each")
    assert walks == [6] and len(maps) == 6
    for c, e in enumerate(maps):
        same(e, rulegraph.explain(path, "epsilon", {"pixel_values": x}, dtype=F64,
                                  condition=f"name {second}:channels={c}"))
    assert close(sum(e.boundary["pixel_values"] for e in maps), full.boundary["pixel_values"]) <= TIGHT


def test_a_channel_condition_under_gradient_times_input_is_the_masked_backward_of_autograd(cnn_model):
    """Under gradient × input, CRP's conditional map (Achtibat et al. 2023, Nature Machine Intelligence)
    has a closed form: the gradient at layer l, masked to the chosen channels, pulled back to the input by
    autograd and multiplied by it, R(x | θ) = x ⊙ (∂a_l/∂x)ᵀ (∂f/∂a_l ⊙ 1[θ])."""
    path, x = cnn_model
    module = cnn.build("cnn")
    module.float().double()         # the exported weights (float32) in float64, as the ONNX file holds them
    front, back = module[:4], module[4:]
    xs = x.clone().requires_grad_(True)
    a = front(xs)
    logits = back(a)
    target = int(logits.argmax())
    g = torch.autograd.grad(logits[0, target], a, retain_graph=True)[0]
    e = rulegraph.explain(path, "gi", {"pixel_values": x}, dtype=F64, at="op Conv")
    second = e.at()[1].node
    for channels in ((0,), (1, 4), (2, 3, 5)):
        mask = torch.zeros(1, a.shape[1], 1, 1, dtype=F64)
        mask[0, list(channels)] = 1
        expected = x * torch.autograd.grad(a, xs, grad_outputs=g * mask, retain_graph=True)[0]
        got = rulegraph.explain(path, "gi", {"pixel_values": x}, dtype=F64,
                                condition=f"name {second}:channels={','.join(map(str, channels))}")
        assert close(got.boundary["pixel_values"], expected) <= 1e-9
        assert close(e.boundary["pixel_values"], expected) > 1e-3         # not the unconditioned map


# --- the command line, as a user types it

def test_the_command_line_prints_and_writes_the_relevance_inside(bert_onnx, tmp_path):
    r = run_cli(["explain", bert_onnx, "--rules", "attnlrp", "--text", TEXT, "--at", "block 1 attention output",
                 "--condition", "block 1 attention output:heads=0,2", "--json", "out.json"], tmp_path)
    r.ok()
    assert "relevance at 'block 1 attention output'" in r.out and "heads 0:" in r.out
    assert "booked as absorbed" in r.out
    d = json.loads((tmp_path / "out.json").read_text())
    (value,) = d["inside"]["block 1 attention output"]
    assert value["axes"] == ["batch", "position", "head", "dim"] and len(value["per_head"]) == 4
    assert value["per_head"][1] == 0 and value["per_head"][3] == 0          # masked before it was recorded
    assert d["condition"]["conditions"] == ["block 1 attention output:heads=0,2"]
    r = run_cli(["explain", bert_onnx, "--rules", "attnlrp", "--text", TEXT,
                 "--condition", "block 1 attention output:heads=0|1,2", "--json", "maps.json"], tmp_path)
    r.ok()
    assert "1/2 · block 1 attention output:heads=0" in r.out and "2/2 · block 1 attention output:heads=1,2" in r.out
    d = json.loads((tmp_path / "maps.json").read_text())
    assert [x["condition"]["conditions"] for x in d] == [["block 1 attention output:heads=0"],
                                                        ["block 1 attention output:heads=1,2"]]
    bad = run_cli(["explain", bert_onnx, "--rules", "attnlrp", "--text", TEXT, "--condition", "op Conv:channels=each",
                   "--png", "x.png"], tmp_path)
    assert bad.code == 2 and "list them as alternatives" in bad.err and "Traceback" not in bad.err
    bad = run_cli(["explain", bert_onnx, "--rules", "attnlrp", "--text", TEXT, "--at", "block 9 MLP activation"],
                  tmp_path)
    assert bad.code == 2 and "selects no value" in bad.err and "Traceback" not in bad.err
