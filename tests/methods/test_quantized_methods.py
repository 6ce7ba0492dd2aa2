"""Every method on a quantized BERT: onnxruntime's ``quantize_dynamic`` (DynamicQuantizeLinear +
MatMulInteger, int8 tables read through DequantizeLinear) and ``quantize_static`` in QDQ format
(QuantizeLinear → DequantizeLinear pairs on the activations).

Every method (rule sets and baselines) reaches the graph through one prologue, loaded and
canonized as its rule set asks, so the quantized graph reaches it as the float computation it
stands for: no result is all zero, and each method ranks the tokens as it does on the float model.

The tiny random BERT's weights are scaled by :data:`SCALE` so that the tokens matter: with the
initialiser's standard deviation (0.02) its logits are about 0.003 and every method's scores
but the first token's are at the level of the rounding a quantized model adds, so their ranks
would compare rounding with rounding.
"""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import torch

import rulegraph
import tiny
from rulegraph.errors import RulegraphError
from rulegraph.heads import mask_text
from rulegraph.methods import BASELINES, explain_with, explained, names
from rulegraph.canonize.quantization import QUANTIZED_OPS

NAMES = ("input_ids", "attention_mask", "token_type_ids")
#: every weight matrix and embedding table multiplied by this (standard deviation 0.02 → 0.16)
SCALE = 8.0
#: the random inputs compared (one batch: one row each), and their length
ITEMS, LENGTH = 8, 10
#: the options each method runs with here: few IG steps; leave-one-out deletes (no tokenizer is given)
OPTIONS = {"ig": {"steps": 8}, "loo": {"mode": "delete"}}
#: methods that explain an image classifier only: on this text model (float or quantized) they refuse, saying why
REFUSED = {"epsilon-gamma-box": "no relevance boundary", "epsilon-plus-flat": "no relevance boundary"}
#: the least median Spearman ρ (over the items) between a method's ranks on the quantized and the float
#: model. Measured: ≥ 0.95 for every method on both models, but layer-saliency on the dynamic one (0.745:
#: its α = ReLU(Σ ∂y/∂h · h) is exactly 0 at many positions, and the activations' dynamic rounding moves
#: the small values near 0 to either side). IG's bound is the one asked of it; the others keep a margin.
AGREEMENT = {"ig": 0.8, "layer-saliency": 0.6}
DEFAULT_AGREEMENT = 0.9


def _scaled_bert() -> torch.nn.Module:
    model = tiny.build("bert")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight") and "LayerNorm" not in name:
                p.mul_(SCALE)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The float graph and its two quantized versions, loaded: {"float", "dynamic", "static"}; and a
    head-mask file for mask-lrp-random."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)
    folder = tmp_path_factory.mktemp("quantized_methods")
    source = tiny.onnx(_scaled_bert(), folder / "float.onnx", names=NAMES)
    calibration = iter([{k: v.numpy() for k, v in tiny.token_inputs(NAMES, length=LENGTH, seed=100 + s).items()}
                        for s in range(8)])

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(calibration, None)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(str(source), str(folder / "dynamic.onnx"), weight_type=QuantType.QInt8)
        quantize_static(str(source), str(folder / "static.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                        weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
    masks = folder / "masks.yaml"
    masks.write_text(mask_text({0: ["positional", "none", "syntactic", "none"],
                                1: ["none", "syntactic", "none", "positional"]}))
    graphs = {k: rulegraph.load(folder / f"{k}.onnx") for k in ("float", "dynamic", "static")}
    return graphs, {"mask-lrp-random": {"masks": str(masks)}}


def _feeds() -> dict[str, torch.Tensor]:
    return tiny.token_inputs(NAMES, batch=ITEMS, length=LENGTH, seed=7)


_FLOAT: dict[str, np.ndarray] = {}      # method → its scores on the float model (compared twice)


def _scores(graph, method: str, extra) -> np.ndarray:
    e = explain_with(graph, method, _feeds(), dtype=torch.float64, **OPTIONS.get(method, {}), **extra.get(method, {}))
    return np.asarray(e.relevance["input_ids"], dtype=np.float64)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's ρ: Pearson's correlation of the ranks (ties get their mean rank)."""
    from scipy.stats import rankdata
    ra, rb = rankdata(a), rankdata(b)
    return float(np.corrcoef(ra, rb)[0, 1])


def agreement(models, method: str, how: str) -> tuple[float, np.ndarray]:
    """The median over the items of ρ(method on the float model, method on the ``how`` model), and
    the quantized scores."""
    graphs, extra = models
    if method not in _FLOAT:
        _FLOAT[method] = _scores(graphs["float"], method, extra)
    ours, reference = _scores(graphs[how], method, extra), _FLOAT[method]
    return float(np.median([spearman(a, b) for a, b in zip(reference, ours)])), ours


@pytest.mark.parametrize("how", ["dynamic", "static"])
@pytest.mark.parametrize("method", names())
def test_every_method_ranks_the_tokens_of_a_quantized_model_as_of_the_float_one(models, method, how):
    if method in REFUSED:
        for graph in (models[0]["float"], models[0][how]):
            with pytest.raises(RulegraphError, match=REFUSED[method]):
                _scores(graph, method, models[1])
        return
    rho, scores = agreement(models, method, how)
    print(f"{method} {how}: median Spearman {rho:.3f}")
    assert not any((row == 0).all() for row in scores), f"{method}: an all-zero explanation of the {how} model"
    assert rho >= AGREEMENT.get(method, DEFAULT_AGREEMENT), f"{method} on the {how} model: median ρ {rho:.3f}"


@pytest.mark.parametrize("how", ["dynamic", "static"])
def test_a_baseline_is_handed_the_canonized_graph_and_its_binding(models, how):
    """What made ``ig`` return 0 on a quantized model: a baseline bound its rule set to the graph as loaded,
    whose integer ops stop the gradient. A baseline registered here sees only what the method layer hands it."""
    graphs, _ = models
    assert QUANTIZED_OPS & graphs[how].op_types()
    seen = {}

    def probe(req):
        seen.update(ops=req.graph.op_types(), binding=req.binding, graph=req.graph, ruleset=req.ruleset.name)
        return BASELINES.get("gs").run(req)

    BASELINES.add("probe", dataclasses.replace(BASELINES.get("gs"), name="probe", run=probe))
    try:
        e = explain_with(graphs[how], "probe", _feeds())
    finally:
        BASELINES.remove("probe")
    assert not QUANTIZED_OPS & seen["ops"]
    assert seen["ruleset"] == "gi" and seen["binding"].graph is seen["graph"]
    assert not QUANTIZED_OPS & {n.op for n in seen["binding"].graph.nodes}
    assert all(torch.as_tensor(r).abs().sum() > 0 for r in e.relevance["input_ids"])


def test_the_call_s_score_and_contrast_win_over_a_rule_set_s_options():
    options = {"score": "logprob", "contrast": "runner-up", "record": ()}
    assert explained(dict(options)) == ("runner-up", "logprob")
    assert explained(dict(options), 1, "logit") == (1, "logprob")
    assert explained(dict(options), None, "logprob") == ("runner-up", "logprob")
    assert explained({"score": "logit", "contrast": None}, 2, "logprob") == (2, "logprob")
    rest = dict(options)
    explained(rest)
    assert rest == {"record": ()}
