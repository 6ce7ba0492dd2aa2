"""Every method explains the same value of a classifier that ends in Softmax or LogSoftmax: the logits
before it, as the rule sets do (``e.extra["final"]`` says so), or with ``score="probability"`` the
final node's output itself.

The files are a tiny random BERT classifier whose classifier head is followed by the final node,
exported as deployments export it; the reference values are the Hugging Face module's own logits.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import rulegraph
import tiny
from rulegraph.errors import InputError, RulegraphError
from rulegraph.heads import mask_text
from rulegraph.methods import BASELINES, explain_with, names

NAMES = ("input_ids", "attention_mask", "token_type_ids")
FINALS = ("Softmax", "LogSoftmax")
#: the options each method runs with here: few IG steps; leave-one-out deletes (no tokenizer is given)
OPTIONS = {"ig": {"steps": 4}, "loo": {"mode": "delete"}}
#: the image rule sets have no boundary on a token model; they say so whatever its last node
REFUSED = {"epsilon-gamma-box": "no relevance boundary", "epsilon-plus-flat": "no relevance boundary"}


def _classifier(final: str | None) -> torch.nn.Module:
    model = tiny.build("bert")
    if final is not None:
        model.classifier = torch.nn.Sequential(model.classifier, getattr(torch.nn, final)(-1))
    return model.eval()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """``Softmax`` / ``LogSoftmax`` → (the exported file, the module's logits and final output for
    :func:`_feeds`); ``masks`` → a head-mask file for mask-lrp-random."""
    folder = tmp_path_factory.mktemp("final_softmax_methods")
    made = {}
    for final in FINALS:
        model = _classifier(final)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            path = tiny.onnx(model, folder / f"{final}.onnx", names=NAMES)
        with torch.no_grad():
            probs = model(**_feeds()).logits.double()
            logits = model.bert(**_feeds()).pooler_output
            logits = model.classifier[0](logits).double()
        made[final] = (path, logits, probs)
    masks = folder / "masks.yaml"
    masks.write_text(mask_text({0: ["positional", "none", "syntactic", "none"],
                                1: ["none", "syntactic", "none", "positional"]}))
    made["masks"] = str(masks)
    return made


def _feeds() -> dict[str, torch.Tensor]:
    return tiny.token_inputs(NAMES, batch=2, length=6, seed=3)


def _options(files, method: str) -> dict:
    return {**OPTIONS, "mask-lrp-random": {"masks": files["masks"]}}.get(method, {})


def _picked(values: torch.Tensor, targets: list[int]) -> list[float]:
    return values.gather(1, torch.tensor(targets)[:, None]).squeeze(1).tolist()


@pytest.mark.parametrize("final", FINALS)
@pytest.mark.parametrize("method", names())
def test_every_method_explains_the_logit_before_a_final_softmax(files, method, final):
    path, logits, _ = files[final]
    if method in REFUSED:
        with pytest.raises(RulegraphError, match=REFUSED[method]):
            rulegraph.explain(str(path), method, _feeds(), dtype=torch.float64, **_options(files, method))
        return
    e = rulegraph.explain(str(path), method, _feeds(), dtype=torch.float64, **_options(files, method))
    assert e.extra["final"] == {"op": final, "output": "logits", "logits": e.output}, e.extra.get("final")
    assert e.target == logits.argmax(-1).tolist()
    assert e.output_value == pytest.approx(_picked(logits, e.target), abs=1e-5)


@pytest.mark.parametrize("final", FINALS)
@pytest.mark.parametrize("method", list(BASELINES))
def test_score_probability_makes_every_baseline_explain_the_final_output(files, method, final):
    path, _, probs = files[final]
    e = rulegraph.explain(str(path), method, _feeds(), dtype=torch.float64, score="probability",
                          **_options(files, method))
    assert e.output == "logits" and "final" not in e.extra
    assert e.output_value == pytest.approx(_picked(probs, e.target), abs=1e-5)


def test_leave_one_out_reads_the_logits_from_onnxruntime(files):
    """In float32 on the CPU, leave-one-out runs its perturbed sequences through onnxruntime, which returns
    the logits the file computes before its Softmax (an output added to the session); the drops equal the
    interpreter's."""
    path, logits, _ = files["Softmax"]
    graph = rulegraph.load(str(path))
    runs = {runtime: explain_with(graph, "loo", _feeds(), mode="delete", runtime=runtime)
            for runtime in ("onnxruntime", "rulegraph")}
    assert runs["onnxruntime"].extra["final"]["op"] == "Softmax"
    torch.testing.assert_close(runs["onnxruntime"].relevance["input_ids"], runs["rulegraph"].relevance["input_ids"],
                               atol=1e-5, rtol=1e-4)
    assert runs["onnxruntime"].relevance["input_ids"].abs().sum() > 0


def test_score_probability_without_a_final_softmax_is_refused_by_a_baseline(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = tiny.onnx(_classifier(None), tmp_path / "plain.onnx", names=NAMES)
    with pytest.raises(InputError, match="score='probability' explains the output of a final Softmax or LogSoftmax"):
        rulegraph.explain(str(path), "gs", _feeds(), score="probability")
