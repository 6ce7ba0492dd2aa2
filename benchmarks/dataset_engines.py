"""Dataset-scale throughput: ``explain-dataset`` on the local engine vs a local Ray cluster,
per method, side by side in one run; and the peak memory of one worker at 512 tokens.

    python benchmarks/dataset_engines.py [--n 200] [--out benchmarks/results/dataset_engines.md]

Data: the first ``--n`` held-out Rotten Tomatoes sentences (demo model, `make demo`). Engines:
``local`` with 1 and 2 torch threads; ``ray`` with 2 workers × 1 CPU on ``ray.init(num_cpus=2)``
(cluster start timed apart; every run spawns its workers, which load the model: that is counted).
Rounds interleave the engines, and the table shows medians of examples/s. Memory: a fresh
process per method explains one 512-token IMDB review and reports its peak RSS (what one
worker needs at 512 tokens), beside the RSS after loading the model alone.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from harness import machine

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "sentiment"))

import data  # noqa: E402
import train  # noqa: E402

from rulegraph.scale import engine  # noqa: E402
from rulegraph.scale.explain import DatasetConfig, explain_dataset  # noqa: E402

METHODS = ["gi", "lrp-ah-ln", "attnlrp", "decomposition"]
MEMORY = """
import json, resource, torch
import rulegraph
from rulegraph.text import TextEncoder
torch.set_num_threads(1)
graph = rulegraph.load({model!r})
encoder = TextEncoder.for_model(graph, {model!r}, None)
inputs = encoder.encode(json.load(open({text!r}))).inputs
loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
rulegraph.explain(graph, {method!r}, inputs, audit=False)
print(loaded, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, inputs["input_ids"].shape[1])
"""

def throughput(model: Path, csv_path: Path, method: str, variant: str, folder: Path) -> float:
    config = DatasetConfig(str(model), str(csv_path), method, batch=16)
    if variant.startswith("local"):
        torch.set_num_threads(int(variant[-1]))
        chosen = engine("local")
    else:
        torch.set_num_threads(1)
        chosen = engine("ray", num_workers=2)
    summary = explain_dataset(config, folder / f"{method}-{variant}", engine=chosen, force=True)
    assert summary["failed"] == 0, summary["first_error"]
    return summary["examples_per_second"]


def memory_table(model: Path) -> list[str]:
    """Peak RSS of a fresh process (1 thread) explaining one 512-token IMDB review, per method. The
    review is picked here and handed over in a file, so the process loads the model and nothing else."""
    from rulegraph.loaders import load
    from rulegraph.text import TextEncoder
    encoder = TextEncoder.for_model(load(str(model)), str(model), None)
    _, test = data.imdb()
    text = next(t for t, _ in test if len(encoder.encode(t).tokens) >= 512)
    lines = ["Peak memory of one worker (one process, 1 thread) explaining one 512-token IMDB review "
             "(demo model, float32; RSS includes Python, torch and the loaded model):", "",
             "| method | RSS after loading | peak RSS | tokens |", "|---|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "review.json"
        path.write_text(json.dumps(text))
        for method in METHODS:
            code = MEMORY.format(model=str(model), method=method, text=str(path))
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True).stdout.split()
            lines.append(f"| {method} | {int(out[0]) / 1024:.0f} MiB | {int(out[1]) / 1024:.0f} MiB | {out[2]} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "dataset_engines.md")
    parser.add_argument("--memory-only", action="store_true", help="only the peak memory at 512 tokens")
    args = parser.parse_args()
    if args.memory_only:
        print("\n".join(memory_table(train.ensure_model())))
        return 0
    import ray
    model = train.ensure_model()
    _, test = data.rotten_tomatoes(train.SEED)
    folder = Path(tempfile.mkdtemp(prefix="rulegraph-engines-"))
    csv_path = folder / "data.csv"
    with csv_path.open("w", newline="") as handle:
        csv.writer(handle).writerows([["text", "label"], *test[:args.n]])
    started = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    cluster_seconds = time.perf_counter() - started
    variants = ["local-1", "local-2", "ray-2x1"]
    rates: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for method in METHODS:
            for variant in variants:
                rates.setdefault((method, variant), []).append(throughput(model, csv_path, method, variant, folder))
    ray.shutdown()
    lines = [f"# Dataset engines: local vs Ray (measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)", "",
             f"Machine: {machine()}, ray {ray.__version__}. {args.n} Rotten Tomatoes sentences (demo "
             f"model), batches of 16 bucketed by length; median of {args.rounds} interleaved rounds, examples/s "
             f"(each run includes spawning its workers and loading the model). Ray cluster start: "
             f"{cluster_seconds:.1f} s, once.", "",
             "| method | local, 1 thread | local, 2 threads | ray, 2 workers × 1 CPU | ray / local-2 |",
             "|---|---:|---:|---:|---:|"]
    for method in METHODS:
        med = {v: statistics.median(rates[(method, v)]) for v in variants}
        lines.append(f"| {method} | {med['local-1']:.1f} | {med['local-2']:.1f} | {med['ray-2x1']:.1f} | "
                     f"{med['ray-2x1'] / med['local-2']:.2f}× |")
    lines += ["", *memory_table(model)]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps({f"{m}/{v}": r for (m, v), r in rates.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
