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


# Beyond the encoder's single target: the batched walk (vmap over targets), language models, convolutions,
# recurrent cells and conditioned maps, each on the GPU against the CPU in float64.
F64_ACROSS = 1e-9


@pytest.mark.parametrize("rules", ["attnlrp", "lrp-ah-ln", "decomposition", "gi"])
def test_cuda_many_targets_in_one_walk(bert_onnx, rules):
    from targets import same
    from rulegraph.passes import apply_targets
    feeds = tiny.token_inputs(batch=2, length=7)
    cpu = apply_targets(bert_onnx, rules, feeds, "all", dtype=torch.float64)
    gpu = apply_targets(bert_onnx, rules, feeds, "all", dtype=torch.float64, device="cuda")
    for a, b in zip(gpu, cpu, strict=True):
        same(a, b, rounding=F64_ACROSS)


def test_cuda_language_model_top_k(causal_lm):
    """A causal LM's top-3 next tokens (one walk each on the one forward), AttnLRP, float64."""
    from targets import same
    from rulegraph.passes import apply_targets
    _, path = causal_lm
    ids = torch.tensor([tiny.lm_tokenizer().encode("w1 w2 w3 w4 w5").ids])
    feeds = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    cpu = apply_targets(path, "attnlrp", feeds, "top-3", dtype=torch.float64, score="logprob")
    gpu = apply_targets(path, "attnlrp", feeds, "top-3", dtype=torch.float64, score="logprob", device="cuda")
    for a, b in zip(gpu, cpu, strict=True):
        same(a, b, rounding=F64_ACROSS)


@pytest.mark.parametrize("kind", ["resnet", "mobilenetv3"])
def test_cuda_cnns(tmp_path, kind):
    from targets import same
    from rulegraph.passes import apply_targets
    import cnn
    path = cnn.onnx(cnn.build(kind), tmp_path / "m.onnx", cnn.image(1, 8))
    feeds = {"pixel_values": cnn.image(2, 8)}
    for rules in sorted(rulegraph.shipped_rule_sets("cnns")):
        cpu = apply_targets(path, rules, feeds, "top-2", dtype=torch.float64)
        gpu = apply_targets(path, rules, feeds, "top-2", dtype=torch.float64, device="cuda")
        for a, b in zip(gpu, cpu, strict=True):
            same(a, b, rounding=F64_ACROSS)


def test_cuda_recurrent(tmp_path):
    """A bidirectional LSTM tagger's ONNX LSTM op and the ``recurrent`` rule."""
    from targets import same
    from test_recurrent_models import IDS, Recurrent
    module = Recurrent("LSTM", bidirectional=True, tagger=True).eval()
    path = tmp_path / "model.onnx"
    torch.onnx.export(module, (IDS,), str(path), input_names=["input_ids"], output_names=["logits"],
                      dynamic_axes={"input_ids": {0: "batch", 1: "tokens"}}, dynamo=False, opset_version=17)
    feeds = {"input_ids": IDS}
    for rules in ("epsilon", "gi"):
        cpu = rulegraph.explain(str(path), rules, feeds, dtype=torch.float64)
        gpu = rulegraph.explain(str(path), rules, feeds, dtype=torch.float64, device="cuda")
        same(gpu, cpu, rounding=F64_ACROSS)


def test_cuda_each_head_in_one_walk(bert_onnx):
    """``heads=each``: the conditions' masks stacked beside the seeds, one map per head."""
    from targets import same
    feeds = tiny.token_inputs(batch=1, length=7)
    asked = dict(condition="block 1 attention output:heads=each", dtype=torch.float64)
    cpu = rulegraph.explain(bert_onnx, "attnlrp", feeds, **asked)
    gpu = rulegraph.explain(bert_onnx, "attnlrp", feeds, device="cuda", **asked)
    assert len(gpu) == len(cpu) > 1
    for a, b in zip(gpu, cpu, strict=True):
        same(a, b, rounding=F64_ACROSS)


def test_cuda_audio(tmp_path):
    """An audio classifier over the waveform (Wav2Vec2: GroupNorm as InstanceNormalization, a weight-normed
    positional convolution) from a clip given as ``audio=``."""
    import numpy as np
    import clips
    from targets import same
    from rulegraph.exporters import export_hf
    clips.waveform_classifier(tmp_path / "hf", rate=None)
    path = export_hf(tmp_path / "hf", tmp_path / "out")
    clip = np.sin(np.arange(4000) / 7.0)
    for rules in ("attnlrp", "gi"):
        cpu = rulegraph.explain(path, rules, audio=clip, dtype=torch.float64)
        gpu = rulegraph.explain(path, rules, audio=clip, dtype=torch.float64, device="cuda")
        same(gpu, cpu, rounding=F64_ACROSS)
        assert gpu.extra["audio"] == cpu.extra["audio"]


@pytest.mark.parametrize("rules", ["attnlrp", "lrp-ah-ln", "gi"])
def test_cuda_replay_equals_the_interpreter(bert_onnx, rules):
    """Replayed as CUDA graphs (rulegraph.passes.replay): traced at the first input, replayed at the next of its
    shape, traced again at another shape; each equal to the interpreter on the GPU, an earlier explanation
    untouched by the replays after it."""
    from targets import same
    kept = []
    for feeds in (tiny.token_inputs(batch=2, length=9, pad=3, seed=1), tiny.token_inputs(batch=2, length=9, seed=2),
                  tiny.token_inputs(batch=2, length=9, pad=1, seed=5), tiny.token_inputs(length=6, seed=3)):
        eager = rulegraph.explain(bert_onnx, rules, feeds, dtype=torch.float64, device="cuda")
        replayed = rulegraph.explain(bert_onnx, rules, feeds, dtype=torch.float64, device="cuda", replay=True)
        same(replayed, eager, rounding=F64_ACROSS)
        kept.append((replayed, eager))
    for replayed, eager in kept:
        same(replayed, eager, rounding=F64_ACROSS)


def test_cuda_replay_of_a_language_model(causal_lm):
    from targets import same
    _, path = causal_lm
    for seed in (4, 5):
        ids = tiny.token_inputs(("input_ids", "attention_mask"), length=7, seed=seed)
        eager = rulegraph.explain(path, "attnlrp", ids, dtype=torch.float64, device="cuda")
        replayed = rulegraph.explain(path, "attnlrp", ids, dtype=torch.float64, device="cuda", replay=True)
        same(replayed, eager, rounding=F64_ACROSS)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_cuda_pooled_position_equals_every_position(bert_onnx, dtype, tolerance):
    """The classifier's last layers at the position its pooler reads (rulegraph.canonize.rows.pooled, the default)
    against every position's (``logits="all"``), both on the GPU: the move is kept there (its output agreed) and
    changes no figure beyond the products' rounding."""
    from rulegraph.canonize.rows import SUFFIX
    feeds = tiny.token_inputs(batch=2, length=9, pad=3)
    rows = rulegraph.explain(bert_onnx, "attnlrp", feeds, dtype=dtype, device="cuda")
    whole = rulegraph.explain(bert_onnx, "attnlrp", feeds, dtype=dtype, device="cuda", logits="all")
    assert any(SUFFIX in n.name for n in rows.audit.nodes) and not any(SUFFIX in n.name for n in whole.audit.nodes)
    scale = max(abs(v) for v in whole.output_value)
    for x, y in zip(rows.output_value, whole.output_value, strict=True):
        assert abs(x - y) <= tolerance * scale
    for key, value in whole.relevance.items():
        assert (rows.relevance[key] - value).abs().max() <= tolerance * scale
    for field in ("input_total", "absorbed", "breaks"):
        assert abs(getattr(rows.audit.conservation, field) - getattr(whole.audit.conservation, field)) \
            <= tolerance * scale
