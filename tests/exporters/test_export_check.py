"""Every export is checked before it is written: the exported graph runs at two input sizes other than
the traced one and must agree with the module; on a mismatch the other exporter is tried, and when
neither is right nothing is written and the error gives the figures. A config attribute an
architecture lacks is read from its image processor, or refused in one line."""
from __future__ import annotations

import json

import pytest
import torch

import tiny
from rulegraph.cli import main
from rulegraph.errors import ExportError
from rulegraph.exporters import export_onnx, read_metadata
from rulegraph.exporters.check import resized, sizes, verify

EXAMPLE = {"input_ids": torch.arange(16).reshape(2, 8) % 50, "attention_mask": torch.ones(2, 8, dtype=torch.long)}


class _Pooled(torch.nn.Module):
    """Mean-pools the tokens; ``baked`` divides by the traced length (``int(shape)`` is a constant to
    both tracers); ``tracing`` does so only under the TorchScript tracer (model code with a
    tracing-only shortcut: torch.export sees the symbolic length); ``symbolic`` never."""

    def __init__(self, how: str):
        super().__init__()
        torch.manual_seed(0)
        self.how = how
        self.emb = torch.nn.Embedding(50, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, input_ids, attention_mask):
        h = (self.emb(input_ids) * attention_mask.unsqueeze(-1)).sum(1)
        if self.how == "baked" or self.how == "tracing" and torch.jit.is_tracing():
            h = h / int(input_ids.shape[1])
        else:
            h = h / attention_mask.shape[1]
        return self.head(h)


def test_an_export_fixed_to_the_traced_length_is_caught_and_nothing_is_written(tmp_path):
    with pytest.raises(ExportError) as info:
        export_onnx(_Pooled("baked"), EXAMPLE, tmp_path / "model.onnx")
    message = str(info.value)
    assert "\n" not in message and "nothing was written" in message
    assert "the torchscript export is wrong: at batch 1 × sequence 5 output 'logits' differs from the module's by" in message
    assert "the dynamo export is wrong" in message
    assert list(tmp_path.iterdir()) == []


def test_a_wrong_export_falls_back_to_the_other_exporter(tmp_path):
    path = export_onnx(_Pooled("tracing"), EXAMPLE, tmp_path / "model.onnx")
    meta = read_metadata(path)
    assert meta["rulegraph.exporter"] == "dynamo"
    assert meta["rulegraph.export_check"].startswith("the torchscript export is wrong: at batch 1 × sequence 5")
    assert "dynamo: onnxruntime at batch 1 × sequence 5 and batch 3 × sequence 13 agrees" in meta["rulegraph.export_check"]


def test_a_right_export_records_its_check(tmp_path):
    path = export_onnx(_Pooled("symbolic"), EXAMPLE, tmp_path / "model.onnx")
    meta = read_metadata(path)
    assert meta["rulegraph.exporter"] == "torchscript"
    assert meta["rulegraph.export_check"].startswith("torchscript: onnxruntime at batch 1 × sequence 5 and batch 3 × "
                                                    "sequence 13 agrees with the module to")


def test_without_the_check_the_wrong_export_is_written(tmp_path):
    """``check=False`` is the old behaviour: what the exporter wrote, unverified."""
    path = export_onnx(_Pooled("baked"), EXAMPLE, tmp_path / "model.onnx", check=False)
    assert path.exists() and "rulegraph.export_check" not in read_metadata(path)
    assert not verify(path, _Pooled("baked"), EXAMPLE, {"input_ids": {0: "batch", 1: "sequence"},
                                                         "attention_mask": {0: "batch", 1: "sequence"}}, ["logits"]).ok


def test_the_checked_sizes_differ_from_the_traced_ones_and_stay_within_the_limit():
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "decoder_input_ids": {0: "batch", 1: "decoder_sequence"}}
    example = {"input_ids": torch.zeros(2, 8, dtype=torch.long), "decoder_input_ids": torch.zeros(2, 6, dtype=torch.long)}
    checks = sizes(example, axes)
    assert checks == [{"batch": 1, "sequence": 5, "decoder_sequence": 5}, {"batch": 3, "sequence": 13,
                                                                          "decoder_sequence": 8}]
    limited = sizes(example, axes, max_length=10)
    assert all(2 <= c["sequence"] <= 10 and c["sequence"] != 8 for c in limited)
    grown = resized({"input_ids": torch.arange(8).reshape(1, 8)}, {"input_ids": {1: "sequence"}}, {"sequence": 11})
    assert grown["input_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2]]


def test_the_command_line_prints_the_check(tmp_path, capsys):
    tiny.save_causal_lm("llama", tmp_path / "hf")
    assert main(["export", str(tmp_path / "hf"), str(tmp_path / "out")]) == 0
    assert "checked: torchscript: onnxruntime at batch 1 × sequence 5 and batch 3 × sequence 13 agrees" in \
        capsys.readouterr().out


def test_an_image_config_without_image_size_reads_the_processor_or_is_refused(tmp_path, capsys):
    import transformers
    model = transformers.ResNetForImageClassification(transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3)).eval()
    model.save_pretrained(tmp_path / "hf")
    capsys.readouterr()
    assert main(["export", str(tmp_path / "hf"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "resnet config has no image_size and there is no preprocessor_config.json" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    (tmp_path / "hf" / "preprocessor_config.json").write_text(json.dumps({"crop_size": {"height": 32, "width": 32}}))
    assert main(["export", str(tmp_path / "hf"), str(tmp_path / "out")]) == 0
    assert read_metadata(tmp_path / "out" / "model.onnx")["rulegraph.image_size"] == "[3, 32, 32]"


def test_a_config_without_vocab_size_reads_the_embedding_table(tmp_path):
    """(transformers' configs validate their fields, so a model whose config lacks it is stood in for.)"""
    from types import SimpleNamespace

    from rulegraph.exporters.hf import CODE_POINTS, _vocab_size
    module = tiny.causal_lm("llama")
    bare = SimpleNamespace(config=SimpleNamespace(model_type="llama"), get_input_embeddings=module.get_input_embeddings)
    assert _vocab_size(bare, tmp_path) == len(tiny.VOCAB)
    assert _vocab_size(SimpleNamespace(config=SimpleNamespace()), tmp_path) == CODE_POINTS   # characters (CANINE)
