"""What the evaluation scripts of the examples share: their folders, resuming a run from the per-text
results committed in docs/evaluation/, recording each run segment's wall time, and copying a finished
run's tables, plots and results to docs/evaluation/ (examples/sentiment/evaluate.py, examples/lm/evaluate.py).
"""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from rich.console import Console

from rulegraph.evaluate.runner import RESULTS, Config
from rulegraph.scale import Journal

REPO = Path(__file__).resolve().parents[2]
EVAL_DIR = REPO / ".cache" / "eval"
DOCS_DIR = REPO / "docs" / "evaluation"


def count_rows(out: Path) -> int:
    return len(Journal(out / RESULTS).read())


def record_segment(out: Path, segment: dict) -> None:
    """Add one run to ``run.json``: a resumed evaluation is several runs, and its wall time is their
    sum (``wall_seconds``), each one listed with the rows it found and left (``segments``)."""
    path = out / "run.json"
    previous = json.loads(path.read_text()) if path.exists() and segment["rows_before"] else None
    segments = (previous.get("segments") or [previous]) if previous else []
    segments.append(segment)
    path.write_text(json.dumps({"engine": segment["engine"], "wall_seconds": sum(s["wall_seconds"] for s in segments),
                                "segments": segments}, indent=2) + "\n")


def seed_from_docs(part: str, out: Path, config: Config, console: Console) -> None:
    """Start from the per-text results committed in docs/evaluation/ when there are none here and
    they were made with this very model, tokenizer, texts and settings: the run continues them."""
    committed = DOCS_DIR / f"{part}-results.jsonl.gz"
    if (out / "results.jsonl").exists() or not committed.exists():
        return
    stored = json.loads((DOCS_DIR / f"{part}-config.json").read_text())
    if stored != config.identity():
        differ = sorted(k for k in stored if stored[k] != config.identity().get(k))
        console.print(f"[yellow]The committed {part} results were made with another {', '.join(differ)}; "
                      "starting over.[/]")
        return
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(committed, "rb") as src, (out / "results.jsonl").open("wb") as dst:
        shutil.copyfileobj(src, dst)
    shutil.copyfile(DOCS_DIR / f"{part}-config.json", out / "config.json")
    console.print(f"Continuing the committed {part} results ({committed.relative_to(REPO)}).")


def copy_to_docs(part: str) -> None:
    out = EVAL_DIR / part
    if not (out / "summary.json").exists():
        return
    DOCS_DIR.mkdir(parents=True, exist_ok=True)
    with (out / "results.jsonl").open("rb") as src, gzip.open(DOCS_DIR / f"{part}-results.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    shutil.copyfile(out / "config.json", DOCS_DIR / f"{part}-config.json")
    for name, target in (("table.md", f"{part}-table.md"), ("curves.png", f"{part}-curves.png"), ("run.json", f"{part}-run.json"),
                         ("conservation.png", f"{part}-conservation.png"), ("summary.json", f"{part}-summary.json")):
        if (out / name).exists():
            shutil.copyfile(out / name, DOCS_DIR / target)
    doc = json.loads((out / "summary.json").read_text())
    lines = ["| method | texts | mean tokens | explained / min | evaluated / min (explain + metrics) |",
             "|---|---:|---:|---:|---:|"]
    for method, t in doc["throughput"].items():
        lines.append(f"| {method} | {t['examples']} | {t['mean_tokens']:.1f} | {t['explain_per_minute']:.1f} "
                     f"| {t['evaluated_per_minute']:.1f} |")
    (DOCS_DIR / f"{part}-throughput.md").write_text("\n".join(lines) + "\n")
    done = {m: t["examples"] for m, t in doc["throughput"].items()}
    print(f"{part}: {json.dumps(done)} examples per method -> {DOCS_DIR}")


