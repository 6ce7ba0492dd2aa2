"""The docs' screenshots: the pages `rulegraph explain --html` writes, in headless Chromium.

    python docs/screenshots/make.py [--out docs/screenshots] [--keep FOLDER] [--pages NAME ...]

Pages: a text classifier (the demo sentiment model of `make demo` when .cache/sentiment-minilm
holds it, else a tiny BERT), a decoder-only language model's generation, an encoder–decoder's
explained target, an image classifier, a vision–language model's picture and text, an audio
classifier's clip, and a speech-to-text model's generation over a clip. Every model but the demo
model is built here from a `transformers` config with RANDOM weights over a small English word
vocabulary, saved with ``save_pretrained`` and exported with `rulegraph export` (nothing is
downloaded): their words and heatmaps are arbitrary and show what the pages look like, not what a trained model relies on.
Chromium is Debian's (``apt-get install chromium``); each page is shot at its full height.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import wave
from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image, ImageDraw
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from rulegraph.cli import main as cli

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / ".cache" / "sentiment-minilm" / "model.onnx"
WORDS = ("[PAD] [UNK] [CLS] [SEP] </s> . , the a of and to in is was it that he she they on for with as at by from "
         "this his her their cat dog bird mat house tree river city king queen child man woman sat ran saw found "
         "took gave made went came said because when but or so then there old small big red green blue quiet warm "
         "cold night day home garden road bridge door book letter song story friend water fire stone light good "
         "bad great dull movie film witty gorgeous seductive boring not very").split()
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--force-device-scale-factor=1"]
WIDTH = 1000


def tokenizer(bert: bool = False) -> Tokenizer:
    """Word level over :data:`WORDS`; for BERT with [CLS] … [SEP] around the text."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if bert:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tok


def exported(module: torch.nn.Module, folder: Path, tok: Tokenizer | None = None) -> Path:
    """``module`` saved with ``save_pretrained`` (with ``tok``) and exported with `rulegraph export`:
    the export's path from the folder the pages are made in."""
    module.save_pretrained(folder / "hf")
    if tok is not None:
        tok.save(str(folder / "hf" / "tokenizer.json"))
    if cli(["export", str(folder / "hf"), str(folder / "out"), "--force"]) != 0:
        sys.exit(f"rulegraph export {folder / 'hf'} failed")
    return Path(folder.name) / "out" / "model.onnx"


def picture(path: Path) -> Path:
    """A drawn landscape (sky, sun, hill, tree), 96 × 72 pixels."""
    image = Image.new("RGB", (96, 72), (120, 170, 235))
    draw = ImageDraw.Draw(image)
    draw.ellipse((58, 6, 82, 30), fill=(250, 215, 60))
    draw.ellipse((-30, 44, 120, 120), fill=(70, 150, 70))
    draw.rectangle((20, 30, 25, 52), fill=(110, 70, 40))
    draw.ellipse((10, 14, 36, 38), fill=(40, 110, 50))
    image.save(path)
    return path


def clip(path: Path, rate: int = 16_000) -> Path:
    """A second of a 220 Hz tone swelling and fading, then a 440 Hz one, as 16-bit PCM."""
    t = np.arange(rate) / rate
    tone = np.sin(2 * np.pi * np.where(t < 0.5, 220, 440) * t) * np.exp(-((t % 0.5 - 0.25) / 0.1) ** 2)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((0.5 * tone * 32767).astype("<i2").tobytes())
    return path


def pages(work: Path) -> dict[str, list[str]]:
    """Each page's `rulegraph explain` arguments (its model built and exported in ``work``)."""
    torch.manual_seed(0)
    if DEMO.is_file():          # linked into the folder, so the page names it without this machine's paths
        (work / "sentiment-minilm").symlink_to(DEMO.parent, target_is_directory=True)
        classifier = ["sentiment-minilm/model.onnx", "-t", "a gorgeous, witty, seductive movie"]
    else:
        bert = transformers.BertForSequenceClassification(transformers.BertConfig(
            vocab_size=len(WORDS), max_position_embeddings=64, pad_token_id=0, **SMALL,
            id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1},
            attn_implementation="eager")).eval()
        classifier = [str(exported(bert, work / "bert", tokenizer(bert=True))), "-t", "a gorgeous , witty movie"]
    torch.manual_seed(1)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(WORDS), n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=None,
        eos_token_id=None, initializer_range=0.2, attn_implementation="eager")).eval()
    torch.manual_seed(2)
    eos = WORDS.index("</s>")
    bart = transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=len(WORDS), d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=2, eos_token_id=eos, decoder_start_token_id=eos, forced_eos_token_id=None,
        attn_implementation="eager")).eval()
    torch.manual_seed(3)
    labels = ["landscape", "portrait", "still life"]
    vit = transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=32, patch_size=4, num_channels=3, **SMALL, id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)}, attn_implementation="eager")).eval()
    torch.manual_seed(7)
    vocab = [*WORDS, "<image>"]
    gemma = transformers.Gemma3ForConditionalGeneration(transformers.Gemma3Config(
        vision_config=transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                      num_attention_heads=2, image_size=32, patch_size=8).to_dict(),
        text_config=transformers.Gemma3TextConfig(vocab_size=len(vocab), **SMALL, num_key_value_heads=1,
                                                  head_dim=16, pad_token_id=0, bos_token_id=None,
                                                  eos_token_id=None).to_dict(),
        image_token_index=len(WORDS), mm_tokens_per_image=4)).eval()
    torch.nn.init.normal_(gemma.model.multi_modal_projector.mm_input_projection_weight, std=0.3)   # starts at zero
    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    torch.manual_seed(5)
    w2v = transformers.Wav2Vec2ForSequenceClassification(transformers.Wav2Vec2Config(
        **SMALL, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=4, id2label={0: "speech", 1: "music"}, label2id={"speech": 0, "music": 1},
        attn_implementation="eager")).eval()
    torch.manual_seed(8)
    whisper = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
        vocab_size=len(WORDS), d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
        max_source_positions=100, max_target_positions=32, pad_token_id=0, bos_token_id=2, eos_token_id=eos,
        decoder_start_token_id=eos, attn_implementation="eager")).eval()
    (work / "whisper" / "hf").mkdir(parents=True, exist_ok=True)
    transformers.WhisperFeatureExtractor(feature_size=16, sampling_rate=16_000, hop_length=80, chunk_length=1,
                                         n_fft=400).save_pretrained(work / "whisper" / "hf")
    sound = clip(work / "clip.wav").name
    return {
        "classifier": [*classifier, "-r", "lrp-ah-ln"],
        "generation": [str(exported(gpt2, work / "gpt2", tokenizer())), "-r", "attnlrp",
                       "-t", "the old king found a small letter on the bridge", "--generate", "6"],
        "encoder-decoder": [str(exported(bart, work / "bart", tokenizer())), "-r", "attnlrp",
                            "-t", "the old king found a small letter", "--continuation", "the king found a letter"],
        "image": [str(exported(vit, work / "vit")), "-r", "attnlrp", "--image", picture(work / "picture.png").name,
                  "--size", "32", "--resize", "32"],
        "vision-language": [str(exported(gemma, work / "gemma", words)), "-r", "attnlrp", "--image",
                            picture(work / "picture.png").name, "--text", "the sun on a green field"],
        "audio": [str(exported(w2v, work / "wav2vec2")), "-r", "attnlrp", "--audio", sound],
        "speech": [str(exported(whisper, work / "whisper", tokenizer())), "-r", "attnlrp", "--audio", sound,
                   "--generate", "4", "--ignore-eos"],
    }


def chromium(page: Path, *args: str) -> str:
    """Run headless Chromium on ``page`` with ``args``; its standard output."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        sys.exit("headless Chromium is not installed (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="rulegraph-chromium-") as profile:
        run = subprocess.run([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
                             capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        sys.exit(f"chromium failed on {page}: {run.stderr[-1000:]}")
    return run.stdout


def screenshot(page: Path, out: Path) -> Path:
    """``page`` at :data:`WIDTH` pixels and its full height, as a PNG."""
    measured = page.with_name(page.stem + "-measured.html")
    script = ("<script>addEventListener('load',()=>{const p=document.createElement('pre');p.id='height';"
              "p.textContent=document.documentElement.scrollHeight;document.body.appendChild(p)})</script>")
    measured.write_text(page.read_text(encoding="utf-8").replace("</body>", script + "</body>"), encoding="utf-8")
    height = int(re.search(r'<pre id="height">(\d+)</pre>', chromium(measured, f"--window-size={WIDTH},800",
                                                                     "--dump-dom")).group(1))
    chromium(page, f"--window-size={WIDTH},{height}", f"--screenshot={out}")
    Image.open(out).convert("RGB").save(out, optimize=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    parser.add_argument("--keep", type=Path, help="build the models and pages in this folder (default: a temporary one)")
    parser.add_argument("--pages", nargs="+", metavar="NAME", help="shoot only these pages (default: every one)")
    args = parser.parse_args(argv)
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="rulegraph-screenshots-") as temporary:
        work = args.keep or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        args.out.mkdir(parents=True, exist_ok=True)
        shot, here = {}, Path.cwd()
        try:
            os.chdir(work)              # the pages name their models by paths from here
            made = pages(work)
            chosen = args.pages or list(made)
            unknown = sorted(set(chosen) - set(made))
            if unknown:
                sys.exit(f"unknown page {unknown[0]!r}; pages: {', '.join(made)}")
            for name in chosen:
                if cli(["explain", *made[name], "--html", f"{name}.html", "--force"]) != 0:
                    return 1
        finally:
            os.chdir(here)
        for name in chosen:
            shot[name] = screenshot(work / f"{name}.html", args.out.resolve() / f"{name}.png")
        print(json.dumps({name: f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path} "
                                f"({path.stat().st_size // 1024} kB, {Image.open(path).size[0]}×{Image.open(path).size[1]})"
                          for name, path in shot.items()}, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
