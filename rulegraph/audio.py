"""Waveforms in and relevance over time out, for audio models (``rulegraph explain MODEL --audio FILE.wav``,
and ``rulegraph.explain(model, method, audio=…)``: both through :func:`audio_input`).

A WAV file is read with the standard library: PCM of 8, 16, 24 or 32 bits, its channels averaged into one,
scaled to [−1, 1). It is resampled to the rate the export records (``rulegraph.sampling_rate``, from the
model's feature extractor; 16 kHz where none is recorded) by linear interpolation, and normalised to zero
mean and unit variance where the feature extractor does that (``rulegraph.normalize_audio``, its
``do_normalize``), as Wav2Vec2's does: ``(x − mean) / √(var + 1e-7)``. An array is taken as samples at the
model's rate, normalised alike. Linear interpolation does not filter before it drops samples: for the
feature extractor's own resampling, resample beforehand and give the array.

A model over log-mel features (Whisper and its audio classifier, ``input_features`` ``[batch, mel bins, frames]``)
gets them from its own feature extractor, read from the ``preprocessor_config.json`` beside the model (which
``rulegraph export`` copies; it needs ``transformers``), after the clip is read and resampled as above.

What the summary shows of an explanation over a clip is its relevance over time (:func:`bins`; a
spectrogram's summed over its mel bins).
"""
from __future__ import annotations

import math
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError

if TYPE_CHECKING:
    import torch

#: the rate assumed where the export records none (Wav2Vec2's, HuBERT's, WavLM's)
DEFAULT_RATE = 16_000
#: the longest clip read (seconds, at its own rate and at the model's)
MAX_SECONDS = 600
#: Wav2Vec2's feature extractor's variance floor
VARIANCE_FLOOR = 1e-7
#: the sample widths (bytes) a PCM WAV file may have
WIDTHS = (1, 2, 3, 4)


@dataclass(frozen=True)
class AudioInput:
    """A clip as a model takes it: the graph input it fills, the samples ``[1, n]`` (or log-mel features
    ``[1, mel bins, frames]``), the sampling rate, the positions per second along the last axis (the rate, or
    the frames' rate), and what was done to it."""

    name: str
    tensor: "torch.Tensor"
    rate: int
    per_second: float
    note: str
    filled: int | None = None       # positions along the last axis the clip fills (the rest: the extractor's padding)

    def describe(self) -> str:
        """One line: the input, its shape and length in seconds, what was done to the clip."""
        n = self.tensor.shape[-1]
        shape = "×".join(map(str, self.tensor.shape))
        return f"{self.name} {shape} at {self.rate} Hz ({n / self.per_second:.2f} s): {self.note}"

    @property
    def extra(self) -> dict:
        """What an explanation of this clip records (``e.extra["audio"]``, :func:`record`)."""
        return record(self.name, self.rate, self.per_second)


def record(name: str, rate: int, per_second: float | None = None) -> dict:
    """What an explanation over a clip records (``e.extra["audio"]``): the input, the sampling rate, and the
    positions per second along the input's last axis (the rate for a waveform; the frames' for features)."""
    return {"input": name, "sampling_rate": rate, "per_second": float(per_second or rate)}


def made_up_samples(rate: int) -> int:
    """The length of a made-up waveform (an export's example, ``rulegraph check``'s input): a quarter second,
    enough for an audio encoder's convolutional front end to make frames."""
    return max(rate // 4, 2)

def waveform_input(graph) -> Any:
    """The graph's waveform input (the first float input ``[batch, samples]``), or ``None``."""
    return next((i for i in graph.inputs if i.is_float and i.shape is not None and len(i.shape) == 2), None)


#: the export tasks whose float input of rank 3 is a clip's log-mel features (Whisper's classifier, Whisper)
FEATURE_TASKS = ("audio-classification", "speech-seq2seq")


def features_input(graph) -> Any:
    """An audio model's log-mel input (its first float input ``[batch, mel bins, frames]``, of an export whose
    task is one of :data:`FEATURE_TASKS`), or ``None``."""
    from .loaders.metadata import export_info
    if export_info(graph).task not in FEATURE_TASKS:
        return None
    return next((i for i in graph.inputs if i.is_float and i.shape is not None and len(i.shape) == 3), None)


def audio_input(graph, audio: Any, model_path: str | Path | None = None) -> AudioInput:
    """``audio`` (a WAV file's path, or an array of samples at the model's rate) made the model's waveform input:
    resampled to the export's rate and normalised as its feature extractor says; or, for a model over log-mel
    features, those its feature extractor (beside ``model_path``) computes. A model without either input is
    refused naming its inputs."""
    from .loaders.metadata import export_info
    wave_in = waveform_input(graph)
    features = features_input(graph) if wave_in is None else None
    if features is not None:
        return _features(graph, features, audio, model_path)
    if wave_in is None:
        names = ", ".join(graph.input_names)
        raise InputError(f"audio=… needs a model with a waveform input [batch, samples]; this model takes {names}",
                         cli=f"--audio needs a model with a waveform input [batch, samples]; this model takes "
                             f"{names}")
    info = export_info(graph)
    rate = info.sampling_rate or DEFAULT_RATE
    samples, notes = load(audio, rate)
    if info.sampling_rate is None:
        notes.append(f"the export records no sampling rate: {DEFAULT_RATE} Hz assumed")
    if info.normalize_audio is not False:
        samples = (samples - samples.mean()) / (samples.var(unbiased=False) + VARIANCE_FLOOR).sqrt()
        notes.append("normalised to zero mean and unit variance")
    return AudioInput(wave_in.name, samples.float().unsqueeze(0), rate, rate, "; ".join(notes) or "as given")


def _features(graph, features, audio: Any, model_path) -> AudioInput:
    """The log-mel features of ``audio`` as the model's feature extractor computes them."""
    from .loaders.metadata import export_info
    path = Path(model_path) if model_path is not None else None
    config = path.parent / "preprocessor_config.json" if path is not None else None
    if config is None or not config.is_file():
        raise InputError(f"{features.name} takes log-mel features: their feature extractor's preprocessor_config.json "
                         "must lie beside the model (rulegraph export copies it)")
    try:
        from transformers import AutoFeatureExtractor
    except ImportError:
        raise InputError("log-mel features are computed by the model's feature extractor, which needs transformers "
                         "(pip install 'rulegraph[hf]')") from None
    try:
        extractor = AutoFeatureExtractor.from_pretrained(str(config.parent))
    except (OSError, ValueError, TypeError) as error:
        raise InputError(f"{config}: not a feature extractor transformers reads ({error})") from None
    rate = int(getattr(extractor, "sampling_rate", 0) or export_info(graph).sampling_rate or DEFAULT_RATE)
    samples, notes = load(audio, rate)
    x = extractor(samples.numpy(), sampling_rate=rate, return_tensors="pt")[features.name].float()
    declared = [d if isinstance(d, int) else None for d in features.shape[1:]]
    if x.dim() != 3 or any(d is not None and d != got for d, got in zip(declared, x.shape[1:])):
        raise InputError(f"{config}: its feature extractor makes {features.name} of shape {list(x.shape)}; the model "
                         f"takes [batch, {', '.join(str(d) for d in declared)}]")
    hop = int(getattr(extractor, "hop_length", 0) or 1)
    seconds = samples.numel() / rate
    notes.append(f"{type(extractor).__name__}: {x.shape[1]} mel bins × {x.shape[2]} frames of {hop} samples "
                 f"({x.shape[2] * hop / rate:.2f} s; the clip is {seconds:.2f} s)")
    filled = min(x.shape[2], math.ceil(samples.numel() / hop))
    return AudioInput(features.name, x, rate, rate / hop, "; ".join(notes), filled)


def load(audio: Any, rate: int) -> tuple["torch.Tensor", list[str]]:
    """The samples of ``audio`` at ``rate`` (float64, 1-D) and what was done to them."""
    import numpy as np
    import torch
    if isinstance(audio, (str, Path)):
        data, given = read_wav(Path(audio))
        notes = [f"read at {given} Hz"] if given == rate else [f"resampled from {given} Hz (linear)"]
    else:
        try:
            array = np.asarray(audio, dtype=np.float64)
        except (TypeError, ValueError):
            raise InputError(f"audio= takes a WAV file's path or an array of samples, got {type(audio).__name__}",
                             cli="--audio takes a WAV file") from None
        if array.ndim == 2 and array.shape[0] == 1:
            array = array[0]
        if array.ndim != 1 or array.size < 2 or not np.isfinite(array).all():
            raise InputError(f"audio= takes one clip: a 1-D array of at least 2 finite samples, got shape "
                             f"{list(array.shape)}")
        if array.size > MAX_SECONDS * rate:
            raise InputError(f"the clip is {array.size / rate:.0f} s at {rate} Hz; the limit is {MAX_SECONDS} s")
        data, given, notes = torch.from_numpy(array.copy()), rate, [f"taken as samples at {rate} Hz"]
    if given != rate:
        length = max(round(data.numel() * rate / given), 2)
        data = torch.nn.functional.interpolate(data[None, None], size=length, mode="linear", align_corners=False)[0, 0]
    return data, notes


def read_wav(path: Path) -> tuple["torch.Tensor", int]:
    """A PCM WAV file's samples (float64 in [−1, 1), channels averaged) and its rate; bounded by
    :data:`MAX_SECONDS` before its frames are read."""
    import numpy as np
    import torch
    if not path.is_file():
        raise InputError(f"audio file not found: {path}", cli=f"--audio: file not found: {path}")
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate, frames = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            if width not in WIDTHS or channels < 1 or rate < 1:
                raise InputError(f"{path}: a PCM WAV file of {channels} channel(s), {8 * width}-bit samples at "
                                 f"{rate} Hz is not read (8, 16, 24 or 32-bit PCM)")
            if frames > MAX_SECONDS * rate:
                raise InputError(f"{path}: the clip is {frames / rate:.0f} s; the limit is {MAX_SECONDS} s")
            raw = w.readframes(frames)
    except (wave.Error, EOFError) as error:
        raise InputError(f"{path}: not a PCM WAV file the standard library reads ({error})") from None
    frames = len(raw) // (width * channels)
    if frames < 2:
        raise InputError(f"{path}: the clip holds {frames} sample(s); at least 2 are needed")
    raw = np.frombuffer(raw[:frames * width * channels], dtype=np.uint8).reshape(frames * channels, width)
    if width == 1:                                            # unsigned, centred on 128
        values = raw[:, 0].astype(np.float64) - 128.0
    else:                                                     # little-endian signed
        padded = np.zeros((raw.shape[0], 4), dtype=np.uint8)
        padded[:, 4 - width:] = raw
        values = padded.view("<i4")[:, 0].astype(np.float64) / 2 ** (8 * (4 - width))
    scale = 2.0 ** (8 * width - 1)
    samples = values.reshape(frames, channels).mean(axis=1) / scale
    return torch.from_numpy(samples), rate


def spans(length: int, filled: int | None, per_second: float, count: int = 10) -> list[tuple[int, int, str]]:
    """A clip ``length`` positions long cut into at most ``count`` equal spans, as a generation's matrix shows it
    (one row each): ``(first, end, label)``. Where only its first ``filled`` positions hold the clip (a feature
    extractor pads a clip to its chunk: Whisper's 30 s), those are cut and the padding is one more span."""
    filled = length if filled is None else max(1, min(filled, length))
    k = min(count, filled)
    edges = [round(i * filled / k) for i in range(k + 1)]
    cut = [(a, b, f"{a / per_second:.2f}–{b / per_second:.2f} s") for a, b in zip(edges, edges[1:])]
    if filled < length:
        cut.append((filled, length, f"padding {filled / per_second:.2f}–{length / per_second:.2f} s"))
    return cut


def bins(relevance: "torch.Tensor", rate: float, count: int = 60) -> list[tuple[float, float, float]]:
    """The relevance of a clip ``[positions]`` (``rate`` of them per second) summed over ``count`` equal spans of
    time (fewer for a short clip): ``(start s, end s, Σ relevance)`` each."""
    import torch
    r = torch.as_tensor(relevance).double().reshape(-1)
    n = r.numel()
    count = max(1, min(count, n))
    edges = [round(k * n / count) for k in range(count + 1)]
    sums = torch.stack([r[a:b].sum() for a, b in zip(edges, edges[1:])]).tolist()
    return [(a / rate, b / rate, s) for a, b, s in zip(edges, edges[1:], sums)]


def over_time(relevance: "torch.Tensor") -> tuple["torch.Tensor", str]:
    """One clip's relevance along time: a waveform's samples as they are, a spectrogram's frames summed over
    its mel bins; and what the positions are (``"samples"``, ``"frames"``)."""
    import torch
    r = torch.as_tensor(relevance).double()
    return (r.sum(0), "frames") if r.dim() == 2 else (r.reshape(-1), "samples")


@dataclass(frozen=True)
class OverTime:
    """One clip's relevance read over time (what the terminal, ``repr`` and the page say of it): its positions
    and what they are, its length, the spans of :func:`bins`, where the largest |relevance| lies, the sum."""

    count: int
    what: str               # "samples" or "frames"
    seconds: float
    spans: list[tuple[float, float, float]]
    peak: float             # seconds
    total: float

    @classmethod
    def of(cls, relevance: "torch.Tensor", per_second: float, spans: int = 60) -> "OverTime":
        """``relevance`` of one clip (``[samples]`` or ``[mel bins, frames]``), ``per_second`` positions a second."""
        r, what = over_time(relevance)
        return cls(r.numel(), what, r.numel() / per_second, bins(r, per_second, spans),
                   int(r.abs().argmax()) / per_second, float(r.sum()))

    def strongest(self, k: int = 3) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
        """The ``k`` spans most for the output and most against it, each named by its time (``0.120–0.125 s``)."""
        ranked = sorted(((f"{a:.3f}–{b:.3f} s", s) for a, b, s in self.spans), key=lambda named: named[1])
        return [n for n in reversed(ranked[-k:]) if n[1] > 0], [n for n in ranked[:k] if n[1] < 0]
