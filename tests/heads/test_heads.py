"""Attention blocks and heads found in every export kind; the mask file's errors."""
from __future__ import annotations

import warnings

import pytest
import torch

import rulegraph
import tiny
from rulegraph.errors import InputError
from rulegraph.heads import find_heads, parse_masks

NAMES = {"bert": ("input_ids", "attention_mask", "token_type_ids")}


@pytest.mark.parametrize("arch", ["bert", "roberta", "distilbert", "gpt2"])
def test_torchscript_exports(arch, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = tiny.onnx(tiny.build(arch), tmp_path / "m.onnx", names=NAMES.get(arch, ("input_ids", "attention_mask")))
    blocks = find_heads(rulegraph.load(path))
    assert [(b.block, b.heads) for b in blocks] == [(0, 4), (1, 4)]
    assert all(f"{'h' if arch == 'gpt2' else 'layer'}.{b.block}" in b.product for b in blocks)


def test_dynamo_export(bert_dynamo_onnx):
    blocks = find_heads(rulegraph.load(bert_dynamo_onnx))
    assert [(b.block, b.heads) for b in blocks] == [(0, 4), (1, 4)]
    assert [b.softmax for b in blocks] == ["node_softmax", "node_softmax_1"]


def test_torch_export_and_head_count_from_shapes():
    """torch.export of a GPT-2 with 2 heads and 3 blocks: the count comes from the forward, not a default."""
    from transformers import GPT2Config, GPT2ForSequenceClassification
    from rulegraph.exporters import HFClassifier, export_fx
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=100, n_embd=16, n_layer=3, n_head=2, n_positions=32, num_labels=2,
                        pad_token_id=0, bos_token_id=2, eos_token_id=3)
    model = HFClassifier(GPT2ForSequenceClassification(config).eval())
    x = {"input_ids": torch.arange(5, 21).reshape(2, 8), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    blocks = find_heads(rulegraph.load(export_fx(model, x)))
    assert [(b.block, b.heads) for b in blocks] == [(0, 2), (1, 2), (2, 2)]


def test_check_lists_the_heads(bert_onnx):
    from click.testing import CliRunner
    from rulegraph.cli import cli
    result = CliRunner().invoke(cli, ["check", str(bert_onnx), "--rules", "lrp-ah-ln"])
    assert result.exit_code == 0, result.output
    assert "attention: 2 blocks, 8 heads" in result.output
    assert "layer.1/attention/self/MatMul_1" in result.output.replace("\n", "")
