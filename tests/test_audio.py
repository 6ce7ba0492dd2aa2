"""Clips in and relevance over time out (``rulegraph.audio``): PCM WAV files of every width the standard library
writes read to the exact samples, channels averaged, resampled to the export's rate, normalised as its feature
extractor says; bounds and bad files refused in one line naming the file; ``explain(…, audio=…)`` equal to the
same samples given as inputs; ``rulegraph explain --audio`` as a user types it (the strip over time, the PNG)."""
from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

import clips
import rulegraph
from rulegraph import audio
from rulegraph.errors import InputError
from shell import rulegraph as run_cli

RATE = clips.RATE
write_wav, tone = clips.write_wav, clips.tone


@pytest.mark.parametrize("width", audio.WIDTHS)
def test_every_pcm_width_reads_to_its_samples_and_channels_average(tmp_path, width):
    top = 2 ** (8 * width - 1)
    left = np.array([0, 1, -1, top - 1, -top, top // 2])
    right = np.array([0, -1, 1, -top, top - 1, -(top // 2)])
    samples, rate = audio.read_wav(write_wav(tmp_path / "c.wav", np.stack([left, right], 1), width=width, rate=RATE))
    assert rate == RATE and samples.dtype == torch.float64
    np.testing.assert_array_equal(samples.numpy(), (left + right) / 2 / top)


def test_resampled_linearly_to_the_models_rate(tmp_path):
    ramp = np.arange(0, 1600, dtype=np.int64)[:, None] * 16
    path = write_wav(tmp_path / "r.wav", ramp, width=2, rate=16_000)
    samples, notes = audio.load(path, RATE)
    assert samples.numel() == 800 and notes == ["resampled from 16000 Hz (linear)"]
    steps = samples[1:-1].diff()
    assert torch.allclose(steps, steps[0].expand_as(steps), rtol=0, atol=1e-12)     # a ramp stays a ramp


@pytest.mark.parametrize("make, message", [
    (lambda p: p, "audio file not found"),
    (lambda p: (p.write_bytes(b"RIFF0000WAVEjunk") and p), "not a PCM WAV file the standard library reads"),
    (lambda p: write_wav(p, np.zeros((1, 1)), width=2, rate=RATE), "holds 1 sample"),
])
def test_a_bad_file_is_refused_naming_it(tmp_path, make, message):
    path = make(tmp_path / "bad.wav")
    with pytest.raises(InputError, match=message):
        audio.read_wav(path)


def test_a_clip_over_the_limit_is_refused_before_its_frames_are_read(tmp_path, monkeypatch):
    path = write_wav(tmp_path / "long.wav", np.zeros((3 * RATE, 1)), width=2, rate=RATE)
    monkeypatch.setattr(audio, "MAX_SECONDS", 2)
    monkeypatch.setattr(wave.Wave_read, "readframes", lambda *a: pytest.fail("frames read past the limit"))
    with pytest.raises(InputError, match=r"long\.wav: the clip is 3 s; the limit is 2 s"):
        audio.read_wav(path)
    with pytest.raises(InputError, match="the clip is 3 s at 8000 Hz; the limit is 2 s"):
        audio.load(np.zeros(3 * RATE), RATE)


@pytest.mark.parametrize("array, message", [
    (np.zeros((2, 5)), r"a 1-D array of at least 2 finite samples, got shape \[2, 5\]"),
    (np.array([0.0, np.nan]), "finite samples"), ([0.5], r"at least 2 finite samples, got shape \[1\]"),
    (object(), "takes a WAV file's path or an array of samples, got object"),
])
def test_a_bad_array_is_refused(array, message):
    with pytest.raises(InputError, match=message):
        audio.load(array, RATE)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A tiny Wav2Vec2 classifier exported by rulegraph's exporter, its feature extractor at 8 kHz."""
    from rulegraph.exporters import export_hf
    folder = tmp_path_factory.mktemp("wav2vec2")
    clips.waveform_classifier(folder / "hf", labels=2)
    return export_hf(folder / "hf", folder / "out")


def test_audio_fills_the_waveform_input_as_the_export_says(model, tmp_path):
    """A 16 kHz stereo file for an 8 kHz model: averaged, resampled, normalised; the explanation equals the same
    samples given as inputs, and names its clip and rate."""
    graph = rulegraph.load(model)
    clip = audio.audio_input(graph, tone(tmp_path / "t.wav"))
    assert clip.name == "input_values" and clip.rate == RATE and clip.tensor.shape == (1, int(RATE * 0.3))
    assert abs(float(clip.tensor.mean())) < 1e-6 and abs(float(clip.tensor.std(unbiased=False)) - 1) < 1e-4
    assert "resampled from 16000 Hz (linear); normalised to zero mean and unit variance" in clip.describe()
    e = rulegraph.explain(model, "attnlrp", audio=tmp_path / "t.wav", dtype=torch.float64)
    same = rulegraph.explain(model, "attnlrp", {"input_values": clip.tensor}, dtype=torch.float64)
    torch.testing.assert_close(e.relevance["input_values"], same.relevance["input_values"], rtol=0, atol=0)
    assert e.extra["audio"] == {"input": "input_values", "sampling_rate": RATE, "per_second": RATE} == same.extra["audio"]
    assert e.audit.ok and e.audit.conservation.relative_error <= 1e-10
    spans = audio.bins(e.relevance["input_values"][0], RATE)
    assert len(spans) == 60 and abs(sum(s for _, _, s in spans) - float(e.relevance["input_values"].sum())) < 1e-12


def test_a_batch_of_clips_plots_and_pages_item_by_item(model):
    """Two clips given as inputs: each item keeps its own samples and rate; ``plot`` draws the waveform over the
    spans, the notebook's page embeds that figure instead of a score per sample."""
    x = torch.randn(2, RATE // 4, generator=torch.Generator().manual_seed(3))
    e = rulegraph.explain(model, "gi", {"input_values": x})
    second = e[1]
    assert second.extra["audio"] == {"input": "input_values", "sampling_rate": RATE, "per_second": RATE}
    torch.testing.assert_close(second.clip["input_values"], x[1:])
    figure = second.plot()
    assert len(figure.axes) == 2 and figure.axes[0].lines             # the waveform, the spans' sums
    page = second.to_html()
    assert "2000 samples at 8000 Hz" in page and "data:image/png;base64," in page and page.count("<span") < 100


def test_a_feature_extractor_that_does_not_normalise_is_followed(model):
    graph = rulegraph.load(model)
    graph.metadata["rulegraph.normalize_audio"] = "false"
    x = np.linspace(-0.5, 1.5, RATE // 2)
    np.testing.assert_allclose(audio.audio_input(graph, x).tensor[0].numpy(), x.astype(np.float32))


def test_audio_for_a_model_without_a_waveform_and_with_text_is_refused(model, bert_onnx, tmp_path):
    with pytest.raises(InputError, match="audio=… needs a model with a waveform input .*; this model takes input_ids"):
        rulegraph.explain(bert_onnx, "gi", audio=np.zeros(100))
    with pytest.raises(InputError, match="give text=…, image=… or audio=…, one of them"):
        rulegraph.explain(model, "gi", audio=np.zeros(100), text="hello")


def test_explain_audio_as_typed(model, tmp_path):
    """``rulegraph explain model.onnx -r attnlrp --audio clip.wav --png out.png``: the clip's line, the strip of
    spans over time, the spans for and against, the summary; the PNG written; never a score per sample."""
    tone(tmp_path / "clip.wav")
    ran = run_cli(["explain", str(model), "-r", "attnlrp", "--audio", "clip.wav", "--png", "out.png", "--html",
                   "out.html", "--json", "out.json"], tmp_path)
    ran.ok()
    page = (tmp_path / "out.html").read_text()
    assert "input_values: 2400 samples at 8000 Hz (0.30 s)" in page and "data:image/png;base64," in page
    assert page.count("<span") < 100                                  # no score per sample drawn
    written = json.loads((tmp_path / "out.json").read_text())
    assert len(written["relevance"]["input_values"]) == 2400 and written["audio"] == {"input": "input_values", "sampling_rate": RATE, "per_second": RATE}
    assert "input_values 1×2400 at 8000 Hz (0.30 s): resampled from 16000 Hz (linear)" in ran.err
    assert "input_values: relevance over time, 2400 samples at 8000 Hz (0.30 s) in 60 spans of 5 ms" in ran.out
    assert "█" * 60 in ran.out and "the samples carry" in ran.out and "conservation" in ran.out
    assert (tmp_path / "out.png").stat().st_size > 10_000
    refused = run_cli(["explain", str(model), "-r", "gi", "--audio", "missing.wav"], tmp_path)
    assert refused.code != 0 and "missing.wav" in refused.err and "Traceback" not in refused.err


def test_a_log_mel_model_gets_its_feature_extractors_frames(tmp_path, capsys):
    """Whisper's audio classifier: the clip read and resampled, then the features its own feature extractor
    (beside the export) computes; the relevance read over time per frame, summed over the mel bins."""
    from rulegraph.cli import render
    from rulegraph.exporters import export_hf
    _, extractor = clips.whisper_classifier(tmp_path / "hf", labels=2)
    path = export_hf(tmp_path / "hf", tmp_path / "out")
    e = rulegraph.explain(path, "attnlrp", audio=tone(tmp_path / "t.wav"), dtype=torch.float64)
    samples, _ = audio.load(tmp_path / "t.wav", RATE)
    want = extractor(samples.numpy(), sampling_rate=RATE, return_tensors="pt").input_features.float()
    torch.testing.assert_close(e.clip["input_features"], want)
    assert e.extra["audio"] == {"input": "input_features", "sampling_rate": RATE, "per_second": RATE / 80}
    assert e.audit.ok and e.audit.conservation.relative_error <= 1e-10
    head = str(render.audio_lines(e)[0])
    assert head.startswith("input_features: relevance over time, 100 frames at 8000 Hz (1.00 s) in 60 spans"), head
    assert len(e.plot().axes[0].images) == 2                     # the spectrogram, the relevance over it
    from rulegraph.cli import main                               # the command line reads it over time too
    assert main(["explain", str(path), "-r", "attnlrp", "--audio", str(tmp_path / "t.wav")]) in (0, None)
    assert "input_features: relevance over time, 100 frames at 8000 Hz" in capsys.readouterr().out
    with pytest.raises(InputError, match="must lie beside the model"):
        audio.audio_input(rulegraph.load(path), np.zeros(100))


def test_a_clip_is_cut_into_spans_of_time_and_its_padding_is_one_more():
    """A generation's rows of a clip (``audio.spans``): at most ``count`` equal spans of the frames the clip fills,
    covering them once, then the extractor's padding as one span; a clip shorter than ``count`` frames, a frame each."""
    cut = audio.spans(100, 80, 100.0)
    assert [(a, b) for a, b, _ in cut] == [(8 * i, 8 * i + 8) for i in range(10)] + [(80, 100)]
    assert cut[0][2] == "0.00–0.08 s" and cut[-1][2] == "padding 0.80–1.00 s"
    assert [(a, b) for a, b, _ in audio.spans(7, None, 10.0, count=3)] == [(0, 2), (2, 5), (5, 7)]
    assert [(a, b) for a, b, _ in audio.spans(50, 3, 50.0)] == [(0, 1), (1, 2), (2, 3), (3, 50)]
    assert [(a, b) for a, b, _ in audio.spans(4, 9, 1.0)] == [(0, 1), (1, 2), (2, 3), (3, 4)]
