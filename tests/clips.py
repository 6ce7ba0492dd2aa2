"""Tiny random-weight audio models (classifiers, and Whisper as a speech-to-text model) saved with
``save_pretrained`` beside their feature extractor's ``preprocessor_config.json`` (what ``rulegraph export``
reads), and WAV files, for the audio tests."""
from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np
import torch

#: the sampling rate the tiny models' feature extractors state
RATE = 8000
#: a two-convolution front end (total stride 10) under a two-layer encoder
WAVEFORM = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16),
                conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4,
                vocab_size=10, attn_implementation="eager")
#: Wav2Vec2 with GroupNorm in its feature extractor (base), HuBERT with LayerNorm there and pre-norm layers (large)
FAMILIES = {"wav2vec2": ("Wav2Vec2Config", "Wav2Vec2ForSequenceClassification", dict(feat_extract_norm="group")),
            "hubert": ("HubertConfig", "HubertForSequenceClassification",
                       dict(feat_extract_norm="layer", do_stable_layer_norm=True))}


def waveform_classifier(folder: Path, family: str = "wav2vec2", *, labels: int = 3, rate: int | None = RATE,
                        seed: int = 0) -> torch.nn.Module:
    """A classifier over the waveform saved in ``folder`` (with a feature extractor at ``rate``; none where
    ``None``: the export then assumes 16 kHz); returns the module."""
    import transformers
    config_class, model_class, extra = FAMILIES[family]
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**WAVEFORM, **extra, num_labels=labels)
    module = getattr(transformers, model_class)(config).eval()
    module.save_pretrained(folder)
    if rate is not None:
        (Path(folder) / "preprocessor_config.json").write_text(json.dumps({"sampling_rate": rate, "do_normalize": True}))
    return module


#: the tiny Whisper's size: 16 mel bins × 100 frames (one second at :data:`RATE`, a hop of 80 samples)
WHISPER = dict(d_model=32, encoder_layers=2, encoder_attention_heads=4, decoder_layers=1, decoder_attention_heads=4,
               encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=50,
               max_target_positions=20, attn_implementation="eager")


def _whisper_extractor(folder: Path):
    import transformers
    extractor = transformers.WhisperFeatureExtractor(feature_size=16, sampling_rate=RATE, hop_length=80,
                                                     chunk_length=1, n_fft=400)
    extractor.save_pretrained(folder)
    return extractor


def whisper_classifier(folder: Path, *, labels: int = 3, seed: int = 0):
    """Whisper's audio classifier over :data:`WHISPER`'s features saved in ``folder`` with its feature extractor;
    returns (the module, the feature extractor)."""
    import transformers
    torch.manual_seed(seed)
    config = transformers.WhisperConfig(**WHISPER, vocab_size=100, num_labels=labels, eos_token_id=None,
                                        bos_token_id=None, decoder_start_token_id=1, pad_token_id=0)
    module = transformers.WhisperForAudioClassification(config).eval()
    module.save_pretrained(folder)
    return module, _whisper_extractor(folder)


def whisper(folder: Path, *, seed: int = 0, decoder_layers: int = 2):
    """Whisper (speech to text: ``WhisperForConditionalGeneration``) over :data:`WHISPER`'s features, its decoder
    reading the tiny word-level vocabulary (``tiny.VOCAB``: start token 1, end token 3), saved in ``folder`` with
    its feature extractor and ``tokenizer.json``; returns (the module, the feature extractor)."""
    import tiny
    import transformers
    torch.manual_seed(seed)
    config = transformers.WhisperConfig(**{**WHISPER, "decoder_layers": decoder_layers}, vocab_size=len(tiny.VOCAB),
                                        eos_token_id=3, bos_token_id=2, decoder_start_token_id=1, pad_token_id=0)
    module = transformers.WhisperForConditionalGeneration(config).eval()
    module.save_pretrained(folder)
    tiny.lm_tokenizer().save(str(Path(folder) / "tokenizer.json"))
    return module, _whisper_extractor(folder)


def write_wav(path: Path, frames: np.ndarray, *, width: int, rate: int) -> Path:
    """``frames`` ``[n, channels]`` of integers written as PCM of ``width`` bytes (8-bit: unsigned)."""
    data = frames.astype(np.int64)
    if width == 1:
        raw = (data + 128).astype(np.uint8).tobytes()
    else:
        raw = b"".join(int(v).to_bytes(width, "little", signed=True) for v in data.reshape(-1))
    with wave.open(str(path), "wb") as w:
        w.setnchannels(frames.shape[1])
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(raw)
    return path


def tone(path: Path, rate: int = 16_000, seconds: float = 0.3) -> Path:
    """A stereo 440 Hz tone (the right channel half the left) written as 16-bit PCM."""
    t = np.arange(int(rate * seconds)) / rate
    wave_ = (0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype(np.int64)
    return write_wav(path, np.stack([wave_, wave_ // 2], 1), width=2, rate=rate)
