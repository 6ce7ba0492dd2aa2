"""Decoder-only language-model families beyond GPT-2 (Llama-style: RMSNorm, rotary position
embeddings, SwiGLU, grouped-query attention), exported by the project's exporter with random
weights: the forward matches the Hugging Face module, `gi` equals autograd Gradient×Input, and
every shipped transformer rule set covers the graph and conserves in float64."""
from __future__ import annotations

import copy

import pytest
import torch

import rulegraph
import tiny
from rulegraph.cli import main

NAMES = ("input_ids", "attention_mask")


def _llama(kind: str):
    from transformers import (LlamaConfig, LlamaForSequenceClassification, MistralConfig,
                              MistralForSequenceClassification, Qwen2Config, Qwen2ForSequenceClassification)
    config, model = {"llama": (LlamaConfig, LlamaForSequenceClassification),
                     "qwen2": (Qwen2Config, Qwen2ForSequenceClassification),
                     "mistral": (MistralConfig, MistralForSequenceClassification)}[kind]
    torch.manual_seed(0)
    return model(config(vocab_size=len(tiny.VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, num_labels=2,
                        pad_token_id=0, attn_implementation="eager")).eval()


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def exported(request, tmp_path_factory):
    module = _llama(request.param)
    path = tiny.onnx(module, tmp_path_factory.mktemp(request.param) / "model.onnx", names=NAMES)
    return module, path


def test_forward_matches_the_module(exported):
    module, path = exported
    feeds = tiny.token_inputs(NAMES, length=7)
    with torch.no_grad():
        expected = module(**feeds).logits
    got = rulegraph.run(rulegraph.load(path), feeds)["logits"]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_gi_equals_autograd_gradient_times_input(exported):
    module, path = exported
    feeds = tiny.token_inputs(NAMES, length=7)
    e = rulegraph.explain(path, "gi", feeds, dtype=torch.float64)
    model = copy.deepcopy(module).double()
    embeddings = model.get_input_embeddings()(feeds["input_ids"]).detach().requires_grad_(True)
    logits = model(inputs_embeds=embeddings, attention_mask=feeds["attention_mask"]).logits
    logits[0, e.target[0]].backward()
    reference = (embeddings * embeddings.grad).sum(-1).detach()
    # the export holds float32 constants (the rotary frequencies, ε): agreement to ~1e-6 of the largest score
    torch.testing.assert_close(e.relevance["input_ids"], reference, rtol=1e-5,
                               atol=1e-6 * float(reference.abs().max()))


@pytest.mark.parametrize("rules", sorted(rulegraph.shipped_rule_sets()))
def test_every_shipped_rule_set_covers_and_conserves(exported, rules, capsys):
    _, path = exported
    assert main(["check", str(path), "-r", rules]) == 0, capsys.readouterr().out
    e = rulegraph.explain(path, rules, tiny.token_inputs(NAMES, length=7), dtype=torch.float64)
    assert e.audit.conservation.relative_error < 1e-10
    assert not e.audit.unexpected
    assert torch.isfinite(e.relevance["input_ids"]).all()
