"""Tiny random-weight audio classifiers saved with ``save_pretrained`` beside their feature extractor's
``preprocessor_config.json`` (what ``rulegraph export`` reads), for the audio tests."""
from __future__ import annotations

import json
from pathlib import Path

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


def whisper_classifier(folder: Path, *, labels: int = 3, seed: int = 0):
    """Whisper's audio classifier over 16 mel bins × 100 frames (one second at :data:`RATE`, a hop of 80
    samples) saved in ``folder`` with its feature extractor; returns (the module, the feature extractor)."""
    import transformers
    torch.manual_seed(seed)
    config = transformers.WhisperConfig(
        d_model=32, encoder_layers=2, encoder_attention_heads=4, decoder_layers=1, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=50, max_target_positions=20,
        vocab_size=100, num_labels=labels, attn_implementation="eager", eos_token_id=None, bos_token_id=None,
        decoder_start_token_id=1, pad_token_id=0)
    module = transformers.WhisperForAudioClassification(config).eval()
    module.save_pretrained(folder)
    extractor = transformers.WhisperFeatureExtractor(feature_size=16, sampling_rate=RATE, hop_length=80,
                                                     chunk_length=1, n_fft=400)
    extractor.save_pretrained(folder)
    return module, extractor
