"""`rulegraph export` on Hugging Face audio classifiers over the waveform (tiny random-weight Wav2Vec2 and
HuBERT saved with ``save_pretrained``, a feature extractor's ``preprocessor_config.json`` beside them): the
export takes ``input_values`` ``[batch, samples]`` with both axes dynamic (its check runs other lengths),
records the task and the sampling rate, equals the module; ``gi`` equals autograd x·∂f/∂x on the samples,
and every shipped transformer rule set covers it and conserves (float64). A text classifier's class name
ends alike (``…ForSequenceClassification``): the Auto class tells them apart."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

pytest.importorskip("transformers")

import clips  # noqa: E402
import rulegraph  # noqa: E402
from rulegraph.cli import main  # noqa: E402
from rulegraph.exporters import export_hf, read_metadata  # noqa: E402
from rulegraph.exporters.hf import task_of  # noqa: E402

F64 = torch.float64


@pytest.fixture(scope="module", params=list(clips.FAMILIES))
def audio(request, tmp_path_factory) -> tuple[torch.nn.Module, Path]:
    folder = tmp_path_factory.mktemp(request.param)
    module = clips.waveform_classifier(folder / "hf", request.param)
    assert main(["export", str(folder / "hf"), str(folder / "out")]) == 0
    return module, folder / "out" / "model.onnx"


def _clip(samples: int = 1500, batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, samples, generator=torch.Generator().manual_seed(samples))


def test_the_export_records_the_task_and_the_sampling_rate(audio):
    _, path = audio
    metadata = read_metadata(path)
    assert metadata["rulegraph.task"] == "audio-classification"
    assert metadata["rulegraph.sampling_rate"] == str(clips.RATE)
    assert "samples" in metadata["rulegraph.export_check"]          # checked at lengths other than the traced one
    assert (path.parent / "preprocessor_config.json").is_file()


def test_forward_equals_the_module_and_onnxruntime_at_another_length(audio):
    module, path = audio
    x = _clip(1234, batch=2)
    got = rulegraph.run(rulegraph.load(path), {"input_values": x})["logits"]
    torch.testing.assert_close(got, module(input_values=x).logits.detach(), rtol=1e-4, atol=1e-5)
    ours = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input_values": x.numpy()})[0]
    np.testing.assert_allclose(got.numpy(), ours, rtol=1e-4, atol=1e-5)


def test_gi_is_gradient_times_input_on_the_samples(audio):
    """Against autograd on the module with the export's float32 constants (reference.as_exported), float64."""
    from reference import as_exported
    module, path = audio
    x = _clip().double().requires_grad_(True)
    logits = as_exported(module)(input_values=x).logits
    target = int(logits.argmax())
    logits[0, target].backward()
    e = rulegraph.explain(path, "gi", {"input_values": x.detach()}, dtype=F64)
    assert e.target == [target]
    reference = (x * x.grad).detach()
    torch.testing.assert_close(e.relevance["input_values"], reference, rtol=0, atol=1e-10 * float(reference.abs().max()))


@pytest.mark.parametrize("rules", sorted(rulegraph.shipped_rule_sets()))
def test_every_transformer_rule_set_covers_and_conserves(audio, rules):
    _, path = audio
    e = rulegraph.explain(path, rules, {"input_values": _clip()}, dtype=F64)
    assert list(e.relevance) == ["input_values"] and e.relevance["input_values"].shape == (1, 1500)
    assert e.audit.ok and not e.audit.unexpected
    assert e.audit.conservation.relative_error <= 1e-10


def test_a_text_classifier_is_not_taken_for_an_audio_one():
    from transformers import BertConfig, Wav2Vec2Config
    assert task_of(BertConfig(architectures=["BertForSequenceClassification"])) == "sequence-classification"
    assert task_of(Wav2Vec2Config(architectures=["Wav2Vec2ForSequenceClassification"])) == "audio-classification"


def test_a_bad_sampling_rate_is_refused_naming_the_file(tmp_path):
    clips.waveform_classifier(tmp_path / "hf", rate=0)
    with pytest.raises(ValueError, match=r"preprocessor_config\.json: sampling_rate must be an integer in 1…"):
        export_hf(tmp_path / "hf", tmp_path / "out")
    assert not (tmp_path / "out" / "model.onnx").exists()


def test_check_runs_explain_on_a_made_up_quarter_second(audio, capsys):
    """``rulegraph check`` makes up a waveform the convolutional front end has frames for (a quarter second at
    the recorded rate), and counts the heads on one."""
    _, path = audio
    code = main(["check", str(path), "-r", "attnlrp"])
    out = capsys.readouterr().out
    assert code in (0, None), out
    assert f"input_values 1×{clips.RATE // 4}" in out and "attention: 2 blocks, 8 heads" in out, out


@pytest.fixture(scope="module")
def whisper(tmp_path_factory) -> tuple[torch.nn.Module, Path]:
    """A tiny Whisper audio classifier (log-mel features in) with its feature extractor, exported."""
    folder = tmp_path_factory.mktemp("whisper")
    module, _ = clips.whisper_classifier(folder / "hf")
    assert main(["export", str(folder / "hf"), str(folder / "out")]) == 0
    return module, folder / "out" / "model.onnx"


def test_whispers_classifier_takes_log_mel_frames_and_every_set_conserves(whisper):
    """``input_features`` ``[batch, 16, 100]`` (the encoder's frames fixed, the batch dynamic); the forward equals
    the module's; every shipped set conserves in float64 over the mel bins and frames (the decomposition's
    partition is per position of axis 1, here the mel bins: its map has no time axis)."""
    module, path = whisper
    graph = rulegraph.load(path)
    assert [tuple(i.shape[1:]) for i in graph.inputs] == [(16, 100)] and read_metadata(path)["rulegraph.task"] == \
        "audio-classification"
    x = torch.randn(3, 16, 100, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(rulegraph.run(graph, {"input_features": x})["logits"],
                               module(input_features=x).logits.detach(), rtol=1e-4, atol=1e-5)
    for rules in sorted(rulegraph.shipped_rule_sets()):
        e = rulegraph.explain(path, rules, {"input_features": x[:1]}, dtype=F64)
        assert e.boundary["input_features"].shape == ((1, 16) if rules == "decomposition" else (1, 16, 100)), rules
        assert e.audit.ok and e.audit.conservation.relative_error <= 1e-10, rules
