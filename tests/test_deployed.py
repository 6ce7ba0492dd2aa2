"""ONNX files as deployments export them (tests/deployed.py): the explained value is explicit.

Per file: the forward equals onnxruntime; every shipped rule set either explains it and conserves,
or refuses with one line; ``gi`` equals autograd of the same torch module; a final Softmax or
LogSoftmax is explained as its logits (``score="probability"``: its output); an output without a
batch axis is one item's ``[positions, classes]``; a refused output names the ones that can be explained.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

import rulegraph
from rulegraph.dryrun import dry_run, made_up_inputs
from rulegraph.errors import InputError, RulegraphError
from rulegraph.loaders import load
from rulegraph.ruleset import shipped_rule_sets

import cnn
import deployed

RULE_SETS = sorted(shipped_rule_sets(None))
CLASSIFIERS = ["cnn-Softmax", "cnn-LogSoftmax", "transformer-Softmax", "transformer-LogSoftmax"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return deployed.files(tmp_path_factory.mktemp("deployed"))


def _inputs(name: str) -> dict[str, torch.Tensor]:
    return {"pixel_values": cnn.image(2, 8)} if name.startswith(("cnn", "tan", "segmenter")) else {"input_ids": deployed.ids(2, 5)}


def _onnxruntime(path, inputs) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {k: v.numpy().astype(np.float32 if v.is_floating_point() else np.int64)
                              for k, v in inputs.items()})


def _refusal(path, rules, inputs, **kwargs) -> str | None:
    """explain's one-line refusal, or None where it explains."""
    try:
        rulegraph.explain(str(path), rules, inputs, dtype=torch.float64, **kwargs)
    except RulegraphError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("name", CLASSIFIERS)
@pytest.mark.parametrize("rules", RULE_SETS)
def test_final_softmax_is_explained_as_its_logits(files, name, rules):
    inputs = _inputs(name)
    try:
        e = rulegraph.explain(str(files[name]), rules, inputs, dtype=torch.float64)
    except RulegraphError as exc:            # the rule set does not claim the file: check says the same
        run = dry_run(str(files[name]), rules)
        assert run.refusal == str(exc).splitlines()[0] or any(str(exc).startswith(g.reason) for g in run.gaps), \
            (str(exc), run.refusal, [g.reason for g in run.gaps])
        assert not run.ok
        return
    final = name.partition("-")[2]
    assert e.extra["final"] == {"op": final, "output": "probs", "logits": e.output}
    expected = torch.from_numpy(_onnxruntime(files[name], inputs)[0]).double()
    got = e.output_tensor.double().softmax(-1) if final == "Softmax" else e.output_tensor.double().log_softmax(-1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert e.target == e.output_tensor.argmax(-1).tolist()
    assert e.output_value == pytest.approx(e.output_tensor.double().gather(1, torch.tensor(e.target)[:, None])
                                           .squeeze(1).tolist(), abs=1e-9)
    assert e.audit.ok and not e.audit.unexpected, e.audit.conservation
    assert not [n for n in e.audit.nodes if n.op == final and "probs" in n.name]      # the final node is gone
    if rules == "gi":
        torch.testing.assert_close(e.boundary[next(iter(e.boundary))], _gradient_x_input(name, inputs, e.target),
                                   atol=1e-9, rtol=1e-7)


def _gradient_x_input(name: str, inputs, targets) -> torch.Tensor:
    """Autograd's x ⊙ ∂z_target/∂x of the torch module without its final softmax (the embedding's
    output for a transformer, where gi's boundary is)."""
    module = deployed.model(name).double()
    if name.startswith("cnn"):
        x = inputs["pixel_values"].clone().requires_grad_()
        z = module[0](x)
    else:
        x = module.embed(inputs["input_ids"]).detach().requires_grad_()
        z = module.head(module.block(x).mean(1))
    z.gather(1, torch.tensor(targets)[:, None]).sum().backward()
    return (x * x.grad).detach()


@pytest.mark.parametrize("name", ["cnn-Softmax", "transformer-Softmax", "transformer-LogSoftmax"])
def test_score_probability_explains_the_final_output_itself(files, name):
    inputs = _inputs(name)
    e = rulegraph.explain(str(files[name]), "epsilon", inputs, dtype=torch.float64, score="probability")
    probs = torch.from_numpy(_onnxruntime(files[name], inputs)[0]).double()
    assert e.output == "probs" and "final" not in e.extra
    assert e.output_value == pytest.approx(probs.gather(1, torch.tensor(e.target)[:, None]).squeeze(1).tolist(),
                                           abs=1e-6)
    assert e.audit.ok


def test_score_probability_without_a_final_softmax_is_refused(files):
    with pytest.raises(InputError, match="score='probability' explains the output of a final Softmax or LogSoftmax; "
                                         "'logits' is computed by Gemm"):
        rulegraph.explain(str(files["tiny-vocab"]), "epsilon", _inputs("tiny-vocab"), score="probability")


def test_the_logits_named_as_output_equal_the_default(files):
    path, inputs = str(files["transformer-Softmax"]), _inputs("transformer-Softmax")
    default = rulegraph.explain(path, "epsilon", inputs, dtype=torch.float64)
    named = rulegraph.explain(path, "epsilon", inputs, dtype=torch.float64, output=default.output)
    assert named.output == default.output and "final" not in named.extra
    torch.testing.assert_close(named.boundary["input_ids"], default.boundary["input_ids"], atol=0, rtol=0)


def test_a_hidden_state_is_explained_and_conserves(files):
    path, inputs = str(files["transformer-Softmax"]), _inputs("transformer-Softmax")
    hidden = load(path).producer  # the block's LayerNorm output, [batch, positions, hidden]
    value = next(v for v, n in hidden.items() if n.op == "LayerNormalization")
    e = rulegraph.explain(path, "epsilon", inputs, dtype=torch.float64, output=value, position=1)
    module = deployed.model("transformer-Softmax").double()
    torch.testing.assert_close(e.output_tensor.double(), module.block(module.embed(inputs["input_ids"])),
                               atol=1e-5, rtol=1e-5)
    assert e.position == 1 and tuple(e.output_tensor.shape) == (2, 5, deployed.WIDTH)
    assert e.audit.ok


def test_a_value_not_in_the_graph_is_refused_naming_the_outputs(files):
    with pytest.raises(InputError, match="no value named 'nope' in the graph; outputs that can be explained: 'probs'"):
        rulegraph.explain(str(files["cnn-Softmax"]), "epsilon", _inputs("cnn-Softmax"), output="nope")


def test_an_output_without_a_batch_axis_is_one_item(files):
    path = str(files["tagger"])
    ids = deployed.ids(1, 7, deployed.VOCAB + 6)
    (expected,) = _onnxruntime(files["tagger"], {"input_ids": ids})
    assert expected.shape == (7, 7)
    for position in (None, 2):
        e = rulegraph.explain(path, "gi", {"input_ids": ids}, dtype=torch.float64, position=position)
        row = 6 if position is None else position
        assert e.position == row and len(e.target) == 1 and len(e.output_value) == 1
        assert e.target == [int(expected[row].argmax())]
        assert e.output_value[0] == pytest.approx(float(expected[row, e.target[0]]), abs=1e-5)
        module = deployed.model("tagger").double()
        x = module.embed(ids).detach().requires_grad_()
        module.head(torch.relu(x))[0, row, e.target[0]].backward()
        torch.testing.assert_close(e.boundary["input_ids"], (x * x.grad).detach(), atol=1e-9, rtol=1e-7)
        assert e.audit.ok
    for rules in ("decomposition", "epsilon", "cp-lrp"):           # every pass sees the batch axis added
        e = rulegraph.explain(path, rules, {"input_ids": ids}, dtype=torch.float64, position=2)
        assert e.audit.ok and tuple(e.output_tensor.shape) == (1, 7, 7)
        scores = e.scores(None, 0)
        assert scores[2] != 0 and all(s == 0 for k, s in enumerate(scores) if k != 2)   # position 2 sees only token 2
    with pytest.raises(InputError, match="position 7 is out of range; the output has 7 positions"):
        rulegraph.explain(path, "gi", {"input_ids": ids}, position=7)


def test_an_output_without_a_batch_axis_refuses_a_batch(files):
    with pytest.raises(InputError, match=r"output 'logits' \(shape \(5, 7\)\) has no batch axis: its leading dim "
                                         r"is not the inputs' batch \(2\); give one item at a time"):
        rulegraph.explain(str(files["tagger"]), "gi", {"input_ids": deployed.ids(2, 5, deployed.VOCAB + 6)})


def test_an_int64_first_output_is_refused_naming_the_logits(files):
    path, inputs = str(files["pass-through"]), {"input_ids": deployed.ids(2, 5, deployed.VOCAB + 6)}
    with pytest.raises(InputError, match="output 'ids' does not depend on the relevance boundary \\(input_ids\\); "
                                         "outputs that can be explained: 'logits'"):
        rulegraph.explain(path, "epsilon", inputs)
    e = rulegraph.explain(path, "gi", inputs, dtype=torch.float64, output="logits")
    torch.testing.assert_close(e.output_tensor.double(), torch.from_numpy(_onnxruntime(path, inputs)[1]).double(),
                               atol=1e-5, rtol=1e-5)
    assert e.audit.ok
    assert dry_run(path, "epsilon", output="logits").ok


@pytest.mark.parametrize("rules", ["epsilon", "gi", "epsilon-gamma-box"])
def test_an_op_rulegraph_lacks_is_the_first_reason_everywhere(files, rules):
    path = str(files["tan"])
    reason = _refusal(path, rules, _inputs("tan"))
    assert reason.startswith("node '/Tan': op 'Tan' (opset 17) has no implementation in rulegraph")
    run = dry_run(path, rules)
    assert run.refusal == reason and not run.ok and run.gaps[0].kind == "op"


def test_made_up_ids_stay_inside_a_tiny_table(files):
    graph = load(str(files["tiny-vocab"]))
    for length in (6, 11):
        ids = made_up_inputs(graph, length)["input_ids"]
        assert ids.shape == (1, length) and 0 <= int(ids.min()) and int(ids.max()) < deployed.VOCAB
    run = dry_run(str(files["tiny-vocab"]), "epsilon")
    assert run.ok, [g.reason for g in run.gaps]


def test_made_up_images_have_a_size_the_strides_divide(files):
    graph = load(str(files["detector"]))
    assert made_up_inputs(graph, 6)["pixel_values"].shape == (1, 3, 32, 32)
    run = dry_run(str(files["detector"]), "epsilon")
    assert run.ok, [g.reason for g in run.gaps]
    graph.metadata["rulegraph.image_size"] = "[3, 64, 64]"       # what an export states wins
    assert made_up_inputs(graph, 6)["pixel_values"].shape == (1, 3, 64, 64)


@pytest.mark.parametrize("rules", ["gi", "epsilon", "epsilon-gamma-box"])
def test_a_region_of_a_map_is_explained(files, rules):
    inputs = _inputs("segmenter")
    e = rulegraph.explain(str(files["segmenter"]), rules, inputs, dtype=torch.float64,
                          objective="region[2:5, 1:7]")
    (mask,) = _onnxruntime(files["segmenter"], inputs)
    expected = torch.from_numpy(mask).double()[..., 2:5, 1:7].sum((1, 2, 3))
    assert e.output_value == pytest.approx(expected.tolist(), abs=1e-5)
    assert e.extra["objective_value"] == pytest.approx(e.output_value, abs=1e-12)
    assert e.audit.ok and not e.audit.unexpected
    if rules == "gi":
        module = deployed.model("segmenter").double()
        x = inputs["pixel_values"].clone().requires_grad_()
        module(x)[..., 2:5, 1:7].sum().backward()
        torch.testing.assert_close(e.boundary["pixel_values"], (x * x.grad).detach(), atol=1e-9, rtol=1e-7)


@pytest.mark.parametrize("objective, message", [
    ("region[2:9, 1:7]", "the region is outside the map"),
    ("region[5:2, 1:7]", "a region needs y0 < y1 and x0 < x1"),
])
def test_a_bad_region_is_refused(files, objective, message):
    with pytest.raises(InputError, match=message):
        rulegraph.explain(str(files["segmenter"]), "gi", _inputs("segmenter"), objective=objective)
