"""The CUDA path: the same explanations on the GPU as on the CPU. Skipped without CUDA."""
from __future__ import annotations

import re

import pytest
import torch

import rulegraph
import tiny

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.float64, 1e-10)])
@pytest.mark.parametrize("rules", sorted(rulegraph.shipped_rule_sets()))
def test_cuda_matches_cpu(bert_onnx, rules, dtype, tolerance):
    feeds = tiny.token_inputs(batch=2, length=9, pad=3)
    cpu = rulegraph.explain(bert_onnx, rules, feeds, dtype=dtype)
    gpu = rulegraph.explain(bert_onnx, rules, feeds, dtype=dtype, device="cuda")
    assert gpu.target == cpu.target
    scale = cpu.relevance["input_ids"].abs().max()
    assert (gpu.relevance["input_ids"] - cpu.relevance["input_ids"]).abs().max() <= tolerance * scale
    assert gpu.audit.conservation.relative_error <= tolerance
    assert not gpu.audit.unexpected
    assert [n.name for n in gpu.audit.layers] == [n.name for n in cpu.audit.layers]


def test_cuda_forward_and_fx(bert):
    program = torch.export.export(bert.float(), (), tiny.token_inputs(length=8), strict=False)
    graph = rulegraph.load(program)
    feeds = tiny.token_inputs(length=8)
    on_gpu = rulegraph.run(graph, feeds, device="cuda")[graph.outputs[0]]
    on_cpu = rulegraph.run(graph, feeds)[graph.outputs[0]]
    assert on_gpu.device.type == "cuda"
    assert torch.allclose(on_gpu.cpu(), on_cpu, rtol=1e-4, atol=1e-6)


def test_cli_on_cuda(bert_onnx, capsys):
    from rulegraph.cli import main
    assert main(["explain", str(bert_onnx), "-r", "lrp-ah-ln", "-t", "w1 w2", "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^unexplained residual .* rel [0-9.e+-]+ ok$", out, re.M), out     # the audit's verdict
    assert "conserved:" in out and "FLAGGED" not in out, out
