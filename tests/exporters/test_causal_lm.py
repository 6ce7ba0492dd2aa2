"""`rulegraph export` of decoder-only causal LMs saved with `save_pretrained` (GPT-2 and the Llama,
Qwen2, Qwen3, Mistral, Gemma and Gemma 3 `*ForCausalLM`, tiny random weights): the LM head's logits
[batch, positions, vocab] agree with onnxruntime and the Hugging Face module, the task is recorded,
every shipped rule set covers the graph (`rulegraph check`) and conserves on it in float64, and
`gi` equals autograd Gradient×Input of the module."""
from __future__ import annotations


import numpy as np
import onnxruntime as ort
import pytest
import torch

import rulegraph
import tiny
from rulegraph.cli import main
from rulegraph.exporters import read_metadata


@pytest.fixture(scope="module", params=["gpt2", *tiny.LLAMA_STYLE])
def exported(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"export_{request.param}")
    module = tiny.save_causal_lm(request.param, folder / "hf")
    assert main(["export", str(folder / "hf"), str(folder / "out")]) == 0
    return module, folder / "out" / "model.onnx"


def test_forward_equals_onnxruntime_and_the_module(exported):
    module, path = exported
    feeds = tiny.token_inputs(("input_ids", "attention_mask"), batch=2, length=11)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {k: v.numpy() for k, v in feeds.items()})
    with torch.no_grad():
        expected = module(**feeds).logits.numpy()
    assert logits.shape == (2, 11, len(tiny.VOCAB))
    assert np.abs(logits - expected).max() <= 1e-4 * np.abs(expected).max()
    ours = rulegraph.run(rulegraph.load(path), feeds)["logits"].numpy()
    assert np.abs(ours - logits).max() <= 1e-4 * np.abs(logits).max()


def test_metadata_records_the_task(exported):
    _, path = exported
    meta = read_metadata(path)
    assert meta["rulegraph.task"] == "causal-lm" and "rulegraph.labels" not in meta
    assert meta["rulegraph.max_length"] == "64"


@pytest.mark.parametrize("rules", sorted(rulegraph.shipped_rule_sets()))
def test_rulegraph_check_passes(exported, rules, capsys):
    _, path = exported
    assert main(["check", str(path), "-r", rules]) == 0, capsys.readouterr().out


def test_every_rule_set_conserves_and_gi_equals_autograd(exported):
    """The next-token logit at the last position, float64: each rule set's relevance sums to it
    (no node absorbs or leaks), and `gi` is x·∂f/∂x of the Hugging Face module's embeddings."""
    module, path = exported
    feeds = tiny.token_inputs(("input_ids", "attention_mask"), batch=1, length=9)
    graph = rulegraph.load(path)
    for rules in sorted(rulegraph.shipped_rule_sets()):
        e = rulegraph.explain(graph, rules, feeds, dtype=torch.float64)
        c = e.audit.conservation
        assert abs(c.output_value) > 1e-3 and abs(c.residual) <= 1e-9 * abs(c.output_value), rules
        assert not e.audit.unexpected, rules
    e = rulegraph.explain(graph, "gi", feeds, dtype=torch.float64)
    expected = tiny.next_token_gi(module, feeds, e.target[0])
    ours = torch.as_tensor(e.scores("input_ids"), dtype=torch.float64)
    # the export holds float32 constants (rotary frequencies, ε, Gemma's √hidden embedding scale),
    # the float64 module exact ones: agreement to ~1e-5 relative; a wrong rule is off by O(1)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()))


def test_a_classifier_directory_still_exports_as_a_classifier(tmp_path):
    tiny.build("gpt2").save_pretrained(tmp_path / "hf")
    tiny.tokenizer().save(str(tmp_path / "hf" / "tokenizer.json"))
    assert main(["export", str(tmp_path / "hf"), str(tmp_path / "out")]) == 0
    meta = read_metadata(tmp_path / "out" / "model.onnx")
    assert meta["rulegraph.task"] == "sequence-classification" and meta["rulegraph.labels"]


@pytest.mark.parametrize("flags, name", [(["--exporter", "dynamo"], "model.onnx"), (["--format", "fx"], "model.pt2")])
def test_the_other_exporters_generate_the_same(flags, name, tmp_path):
    """The dynamo ONNX export and the torch.export program of a Llama-style LM give the same greedy
    tokens and scores as the TorchScript export."""
    tiny.save_causal_lm("llama", tmp_path / "hf")
    assert main(["export", str(tmp_path / "hf"), str(tmp_path / "ts")]) == 0
    assert main(["export", str(tmp_path / "hf"), str(tmp_path / "other"), *flags]) == 0
    runs = [rulegraph.generate(tmp_path / folder / file, "attnlrp", text="w1 w2 w3", steps=3, dtype=torch.float64)
            for folder, file in (("ts", "model.onnx"), ("other", name))]
    assert [s.token for s in runs[0].steps] == [s.token for s in runs[1].steps]
    assert (runs[0].matrix - runs[1].matrix).nan_to_num().abs().max() < 1e-6
