"""Every family of tests/architectures.py, exported as `rulegraph export` does, end to end: the forward
equals onnxruntime's; `gi` equals autograd Gradient×Input at the token lookups (mapped back to the
input's positions) or at the pixels; under every rule set the family claims, `check`'s dry run passes and
the explanation it ran (float64) conserves; under every other shipped rule set `check` fails exactly when
`explain` does. docs/architectures.md is rendered from the same table."""
from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest
import torch

import rulegraph
from architectures import BY_NAME, CNN_SETS, DOC, FAMILIES, TRANSFORMER_SETS, embedding_gi, export, feeds, pixel_gi, \
    render
from rulegraph.dryrun import dry_run, made_up_inputs
from rulegraph.errors import ExportError, RulegraphError

F64 = torch.float64


@pytest.fixture(scope="module", params=[f"{f.name}-{e}" for f in FAMILIES for e in f.exporters if not f.refused])
def exported(request, tmp_path_factory):
    pytest.importorskip("transformers")
    name, _, exporter = request.param.rpartition("-")
    family = BY_NAME[name]
    module, path = export(family, tmp_path_factory.mktemp(family.name), exporter)
    return family, module, rulegraph.load(str(path)), feeds(family, path)


@pytest.mark.parametrize("name", [f.name for f in FAMILIES if f.refused])
def test_a_family_no_exporter_gets_right_is_refused_at_export_and_nothing_is_written(name, tmp_path):
    pytest.importorskip("transformers")
    family = BY_NAME[name]
    with pytest.raises(ExportError, match=family.refused):
        export(family, tmp_path, family.exporters[0])
    assert not list((tmp_path / family.exporters[0]).glob("model.*"))


def test_the_export_holds_what_the_family_exercises(exported):
    family, _, graph, _ = exported
    held = {n.op for n in graph.nodes} | {f"{n.op}.{k}={v}" for n in graph.nodes for k, v in n.attrs.items()
                                         if isinstance(v, (str, int))}
    assert set(family.ops) <= held, f"{family.name}: {sorted(set(family.ops) - held)} missing"


def test_forward_equals_onnxruntime(exported):
    family, _, graph, inputs = exported
    session = ort.InferenceSession(graph.source.partition(":")[2], providers=["CPUExecutionProvider"])
    expected = session.run(None, {k: v.numpy() for k, v in inputs.items()})[0]
    got = rulegraph.run(graph, inputs)[graph.outputs[0]].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(expected).max())))


def test_gi_equals_autograd_gradient_times_input(exported):
    family, module, graph, inputs = exported
    e = rulegraph.explain(graph, "gi", inputs, dtype=F64)
    if family.kind == "image":
        reference, where = pixel_gi(family, module, inputs, e.target[0])
        got = e.relevance["pixel_values"][:1]
        if where is not None:             # finite differences at a few pixels
            got, reference = got[where], reference[where]
    else:
        reference = embedding_gi(family, module, {k: v[:1] for k, v in inputs.items()}, e.target[0])
        got = e.relevance["input_ids"][:1]
    scale = float(reference.abs().max())
    # float32 constants in the export (and a float32 reference for CANINE) bound the agreement
    tolerance = 1e-5 if family.reference_dtype == F64 else 2e-4
    torch.testing.assert_close(got, reference, rtol=tolerance, atol=tolerance * scale)


@pytest.mark.parametrize("rules", TRANSFORMER_SETS + CNN_SETS)
def test_rule_set_conserves_or_check_fails_with_explain(exported, rules):
    family, _, graph, inputs = exported
    run = dry_run(graph, rules, dtype=F64)
    if rules in family.rule_sets and family.batch == 1:
        assert run.ok, [str(g) for g in run.gaps]
        for e in run.explanations.values():
            assert e.audit.conservation.relative_error <= 1e-10, (rules, e.audit.conservation)
            assert not e.audit.unexpected
        return
    if rules in family.rule_sets:          # claimed at the family's batch: conserves there
        e = rulegraph.explain(graph, rules, inputs, dtype=F64)
        assert e.audit.conservation.relative_error <= 1e-10 and not e.audit.unexpected
    # check and explain agree on the made-up inputs check ran
    assert not run.ok
    failed = {}
    for n in run.lengths or (6,):
        try:
            rulegraph.explain(graph, rules, made_up_inputs(graph, n), dtype=F64)
        except RulegraphError as exc:
            failed[n] = str(exc)
    assert failed, f"check failed ({run.gaps[0]}) but explain ran"
    assert any(g.node is None or g.node in " ".join(failed.values()) for g in run.gaps)


@pytest.mark.parametrize("exported", [f"{f.name}-torchscript" for f in FAMILIES if f.placement == "shifted"],
                         indirect=True)
def test_check_makes_up_rows_an_encoder_decoder_classifier_accepts(exported, tmp_path):
    """Without a tokenizer beside the model, check's made-up ids end in the eos id the export records
    (BART and T5 classifiers read each row's last eos token)."""
    import shutil
    family, _, graph, _ = exported
    alone = tmp_path / "model.onnx"
    shutil.copyfile(graph.source.partition(":")[2], alone)
    assert graph.metadata["rulegraph.eos_token_id"] == "3"
    run = dry_run(str(alone), "lrp-ah", lengths=(6, 9))
    assert run.ok, [str(g) for g in run.gaps]


def test_the_registry_page_is_current():
    text = render()
    if os.environ.get("RULEGRAPH_REGOLD"):
        DOC.write_text(text, encoding="utf-8")
    assert DOC.read_text(encoding="utf-8") == text, "docs/architectures.md is out of date: run with RULEGRAPH_REGOLD=1"
