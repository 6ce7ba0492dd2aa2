"""`rulegraph export` of decoder-only causal LMs saved with `save_pretrained` (GPT-2 and Llama /
Qwen2 / Mistral `*ForCausalLM`, tiny random weights): the LM head's logits [batch, positions,
vocab] agree with onnxruntime and the Hugging Face module, the task is recorded, and every
shipped transformer rule set covers the graph (`rulegraph check`)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

import rulegraph
import tiny
from rulegraph.cli import main
from rulegraph.exporters import read_metadata


@pytest.fixture(scope="module", params=["gpt2", "llama", "qwen2", "mistral"])
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
