"""Speech to text (issue 42): `rulegraph export` of a tiny Whisper (``WhisperForConditionalGeneration``, log-mel
features in, its decoder's ids a graph input) and the generation over a clip: the export equals the module and
onnxruntime; ``gi`` equals autograd Gradient×Input at the features and the decoder's embeddings; every shipped rule
set conserves (float64); greedy generation picks the module's own argmax tokens, and each step's column is what
``explain`` gives on the clip and that prefix, its clip rows the frames' relevance summed over spans of time."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

pytest.importorskip("transformers")

import clips  # noqa: E402
import rulegraph  # noqa: E402
from rulegraph import audio  # noqa: E402
from rulegraph.cli import main  # noqa: E402
from rulegraph.errors import InputError  # noqa: E402
from rulegraph.exporters import read_metadata  # noqa: E402
from rulegraph.exporters.hf import task_of  # noqa: E402
from shell import rulegraph as run_cli  # noqa: E402

F64 = torch.float64


@pytest.fixture(scope="module")
def whisper(tmp_path_factory) -> tuple[torch.nn.Module, object, Path, Path]:
    """The tiny Whisper exported by ``rulegraph export``, and a 0.8 s tone (at twice the model's rate) for it."""
    folder = tmp_path_factory.mktemp("whisper")
    module, extractor = clips.whisper(folder / "hf")
    assert main(["export", str(folder / "hf"), str(folder / "out")]) == 0
    return module, extractor, folder / "out" / "model.onnx", clips.tone(folder / "tone.wav", seconds=0.8)


def _features(extractor, clip: Path) -> torch.Tensor:
    samples, _ = audio.load(clip, clips.RATE)
    return extractor(samples.numpy(), sampling_rate=clips.RATE, return_tensors="pt").input_features.float()


def test_the_export_is_speech_to_text_and_equals_the_module_and_onnxruntime(whisper):
    module, _, path, _ = whisper
    metadata = read_metadata(path)
    assert metadata["rulegraph.task"] == "speech-seq2seq" and metadata["rulegraph.exporter"] == "torchscript"
    assert metadata["rulegraph.sampling_rate"] == str(clips.RATE) and metadata["rulegraph.max_length"] == "20"
    assert metadata["rulegraph.decoder_start_token_id"] == "1" and metadata["rulegraph.eos_token_id"] == "3"
    assert (path.parent / "tokenizer.json").is_file() and (path.parent / "preprocessor_config.json").is_file()
    graph = rulegraph.load(path)
    assert graph.input_names == ["input_features", "decoder_input_ids"]
    g = torch.Generator().manual_seed(3)
    x = {"input_features": torch.randn(2, 16, 100, generator=g), "decoder_input_ids": torch.tensor([[1, 7, 9]] * 2)}
    got = rulegraph.run(graph, x)["logits"]
    want = module(**x, use_cache=False).logits.detach()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    ours = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {k: v.numpy() for k, v in x.items()})[0]
    np.testing.assert_allclose(got.numpy(), ours, rtol=1e-4, atol=1e-5)


def test_an_encoder_decoder_lm_is_not_taken_for_speech_to_text():
    from transformers import BartConfig, WhisperConfig
    assert task_of(WhisperConfig(architectures=["WhisperForConditionalGeneration"])) == "speech-seq2seq"
    assert task_of(BartConfig(architectures=["BartForConditionalGeneration"])) == "seq2seq-lm"


def test_gi_is_gradient_times_input_at_the_features_and_the_decoders_embeddings(whisper, monkeypatch):
    """Against autograd on the module with the export's float32 constants, float64: reference.as_exported's,
    the GELU Whisper's encoder calls as a function after each convolution (√2 in float32) and the LayerNorms' ε
    (an ONNX attribute: float32; each left in float64 moves the features' relevance by ≈1e-9 of its largest).
    The features' x·∂f/∂x per mel bin and frame, the prefix's summed over each embedding."""
    from reference import _f32, _Gelu, as_exported
    module, extractor, path, clip = whisper
    reference = as_exported(module)
    monkeypatch.setattr(torch.nn.functional, "gelu", lambda x, approximate="none": _Gelu()(x))
    for norm in reference.modules():
        if isinstance(norm, torch.nn.LayerNorm):
            norm.eps = _f32(norm.eps)
    x = _features(extractor, clip).double().requires_grad_(True)
    prefix = torch.tensor([[1, 7, 9]])
    embedded = reference.model.decoder.embed_tokens(prefix).detach().requires_grad_(True)
    logits = reference(input_features=x, decoder_inputs_embeds=embedded, use_cache=False).logits
    target = int(logits[0, -1].argmax())
    logits[0, -1, target].backward()
    e = rulegraph.explain(path, "gi", audio=clip, inputs={"decoder_input_ids": prefix}, dtype=F64)
    assert e.target == [target] and e.position == 2
    features = (x * x.grad).detach()
    torch.testing.assert_close(e.boundary["input_features"], features, rtol=0, atol=1e-10 * float(features.abs().max()))
    tokens = (embedded * embedded.grad).sum(-1).detach()
    torch.testing.assert_close(e.relevance["decoder_input_ids"], tokens, rtol=0, atol=1e-10 * float(tokens.abs().max()))


@pytest.mark.parametrize("rules", sorted(rulegraph.shipped_rule_sets()))
def test_every_rule_set_that_claims_it_conserves_and_check_agrees(whisper, rules, capsys):
    _, _, path, clip = whisper
    ran = main(["check", str(path), "-r", rules])
    out = capsys.readouterr().out
    claims = rules not in {"epsilon-gamma-box", "epsilon-plus-flat"}          # the CNN sets: a token model's ids
    if not claims:
        assert ran not in (0, None), out
        with pytest.raises(rulegraph.RulegraphError):
            rulegraph.explain(path, rules, audio=clip, inputs={"decoder_input_ids": torch.tensor([[1, 7]])}, dtype=F64)
        return
    assert ran in (0, None), out
    e = rulegraph.explain(path, rules, audio=clip, inputs={"decoder_input_ids": torch.tensor([[1, 7, 9]])}, dtype=F64)
    assert set(e.relevance) == {"input_features", "decoder_input_ids"}
    assert e.audit.ok and not e.audit.unexpected and e.audit.conservation.relative_error <= 1e-10, rules


def test_greedy_generation_over_a_clip_is_the_modules_argmax_and_each_column_its_explanation(whisper):
    """The tokens are the module's argmax one step at a time; the rows are 10 spans of the 0.8 s clip, the padding to
    the extractor's 1 s chunk, then the target prefix; each step's column equals ``explain`` on the clip and its
    prefix (the spans: the frames' relevance over all mel bins, summed); the audit conserves each step; the same
    tokens as a continuation, explained from one forward, give the same matrix."""
    module, extractor, path, clip = whisper
    g = rulegraph.generate(path, "attnlrp", audio=clip, max_new_tokens=3, dtype=F64, ignore_eos=True)
    x = _features(extractor, clip)
    prefix = [1]
    for _ in range(3):
        prefix.append(int(module(input_features=x, decoder_input_ids=torch.tensor([prefix]), use_cache=False)
                          .logits[0, -1].argmax()))
    assert [s.token for s in g.steps] == prefix[1:]
    assert g.groups == ["audio"] * 11 + ["target"] * 3 and g.rows[0] == "0.00–0.08 s"
    assert g.rows[10] == "padding 0.80–1.00 s" and g.rows[11] == "<pad>"
    assert g.extra["audio"]["spans"][-1] == [80, 100] and g.extra["audio"]["input"] == "input_features"
    for t, step in enumerate(g.steps):
        e = rulegraph.explain(path, "attnlrp", audio=clip, inputs={"decoder_input_ids": torch.tensor([prefix[:t + 1]])},
                              dtype=F64)
        over_time = e.boundary["input_features"][0].sum(0)
        spans = [float(over_time[a:b].sum()) for a, b in g.extra["audio"]["spans"]]
        column = g.matrix[:, t]
        torch.testing.assert_close(column[:11], torch.tensor(spans, dtype=F64), rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(column[11:12 + t], e.relevance["decoder_input_ids"][0].double(), rtol=1e-12,
                                   atol=1e-15)
        assert column[12 + t:].isnan().all()
        assert step.relative_error <= 1e-10 and step.output_value == pytest.approx(e.output_value[0], rel=1e-12)
    again = rulegraph.generate(path, "attnlrp", audio=clip, continuation=prefix[1:], dtype=F64)
    torch.testing.assert_close(again.matrix, g.matrix, rtol=1e-10, atol=1e-14, equal_nan=True)
    assert set(g.shares()) == {"audio", "target"}


def test_a_clip_without_a_target_explains_the_first_token(whisper):
    """``explain(…, audio=…)`` with no ``decoder_input_ids``: the prefix is the decoder start token, and the
    explanation is the first step of a generation."""
    _, _, path, clip = whisper
    e = rulegraph.explain(path, "attnlrp", audio=clip, dtype=F64)
    g = rulegraph.generate(path, "attnlrp", audio=clip, max_new_tokens=1, dtype=F64)
    assert e.position == 0 and e.target == [g.steps[0].token] and e.relevance["decoder_input_ids"].shape == (1, 1)
    assert e.output_value[0] == g.steps[0].output_value and e.extra["audio"]["input"] == "input_features"


def test_a_clip_is_refused_where_it_does_not_apply_and_required_where_it_does(whisper, tmp_path):
    _, _, path, clip = whisper
    with pytest.raises(InputError, match="source is a clip: give audio="):
        rulegraph.generate(path, "gi", max_new_tokens=1)
    with pytest.raises(InputError, match="source is its clip"):
        rulegraph.generate(path, "gi", audio=clip, text="w5 w6", max_new_tokens=1)
    with pytest.raises(InputError, match="gives no relevance per frame"):
        rulegraph.generate(path, "random", audio=clip, max_new_tokens=1)
    import tiny
    module = tiny.seq2seq("bart")                   # an encoder–decoder over text takes no clip
    lm = tiny.seq2seq_onnx(module, tmp_path / "bart.onnx")
    with pytest.raises(InputError, match="audio= is a speech-to-text model's clip"):
        rulegraph.generate(lm, "gi", inputs={"input_ids": [[5, 6, 7]]}, audio=clip, max_new_tokens=1)


def test_the_command_line_generates_over_a_clip_as_a_user_types_it(whisper, tmp_path):
    _, _, path, clip = whisper
    ran = run_cli(["explain", str(path), "--audio", str(clip), "--generate", "2", "-r", "attnlrp",
                   "--html", "g.html", "--png", "g.png", "--json", "g.json"], tmp_path)
    assert ran.code == 0, ran.err
    assert "input_features 1×16×100 at 8000 Hz" in ran.err and "0.00–0.08 s" in ran.out and "padding" in ran.out
    page = (tmp_path / "g.html").read_text()
    assert "<p>clip: <b>resampled from 16000 Hz" in page and "audio share" in page
    assert (tmp_path / "g.png").stat().st_size > 5_000


def test_the_command_line_refuses_a_text_for_a_clip_and_never_writes_over_it(whisper, capsys):
    _, _, path, clip = whisper
    for extra, says in (([], "source is a clip: give --audio FILE.wav"), (["--audio", str(clip)], "give no --text")):
        assert main(["explain", str(path), "--generate", "2", "-r", "attnlrp", "--text", "w5", *extra]) == 2
        assert says in capsys.readouterr().err
    size = clip.stat().st_size
    assert main(["explain", str(path), "--audio", str(clip), "--generate", "1", "-r", "gi", "--html", str(clip),
                 "--force"]) == 2
    assert "is a file this run reads" in capsys.readouterr().err and clip.stat().st_size == size    # not written over
