""":func:`rulegraph.stream.hidden_states` (the value each block hands on) on BERT (post-LN) and GPT-2
(pre-LN) exports from both exporters, against the Hugging Face module's own hidden states."""
from __future__ import annotations

import pytest
import torch

import tiny
from rulegraph.interpreter import prepare
from rulegraph.stream import hidden_states
from rulegraph.loaders import load

NAMES = {"bert": ("input_ids", "attention_mask", "token_type_ids"), "gpt2": ("input_ids", "attention_mask")}


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_hidden_states_are_the_residual_stream_between_blocks(arch, exporter, tmp_path, request):
    module = tiny.build(arch)
    if arch == "bert":      # the session's exports of the same seeded model
        path = request.getfixturevalue("bert_onnx" if exporter == "torchscript" else "bert_dynamo_onnx")
    else:
        path = tiny.onnx(module, tmp_path / "model.onnx", names=NAMES[arch], exporter=exporter)
    graph = load(path)
    values = hidden_states(graph)
    assert len(values) == tiny.SIZE["layers"] + 1
    kinds = [graph.producer[v].op for v in values]
    if arch == "bert":          # post-LN: every block ends in its output LayerNorm (and so do the embeddings)
        assert kinds == ["LayerNormalization"] * 3
    else:                       # pre-LN: the residual sums (token + position embeddings first)
        assert kinds == ["Add"] * 3
    feeds = tiny.token_inputs(NAMES[arch], batch=2, length=7, pad=2)
    env = prepare(graph, "cpu", torch.float64).run(feeds, keep=frozenset(values))
    module = module.double()
    kept = {}
    last = (module.bert.encoder.layer if arch == "bert" else module.transformer.h)[-1]
    handle = last.register_forward_hook(lambda m, a, out: kept.setdefault("last", out[0] if isinstance(out, tuple)
                                                                          else out))
    try:
        with torch.no_grad():
            expected = list(module(**feeds, output_hidden_states=True).hidden_states)
    finally:
        handle.remove()
    expected[-1] = kept["last"]     # GPT-2's last hidden state is after ln_f; the block hands on the sum before it
    real = feeds["attention_mask"].bool()
    for v, h in zip(values, expected):
        assert torch.allclose(env[v][real], h[real], atol=1e-6), v
