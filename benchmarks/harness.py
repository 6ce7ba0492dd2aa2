"""What the benchmarks share: the machine described once, calls timed interleaved round after round
(a busy machine slows them alike; medians and quartiles), peak memory measured in a process of its
own, a fair autograd baseline, and the results written as Markdown with their conditions.

Run a benchmark alone on the machine: two processes that each use every core make each other's
threads wait, and the times then measure the scheduler. Ratios of interleaved calls hold up
better than absolute times; both are written down with the conditions.
"""
from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine(threads: int | None = None) -> str:
    """One line: the date, the CPU, its cores, the library versions, the torch threads used."""
    import torch
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    parts = [f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", cpu_name(), f"{cores} cores",
             f"torch {torch.__version__}"]
    try:
        import onnxruntime
        parts.append(f"onnxruntime {onnxruntime.__version__}")
    except ImportError:
        pass
    parts.append(f"{threads if threads is not None else torch.get_num_threads()} torch threads")
    return " · ".join(parts)


def interleave(calls: dict[str, Callable[[], Any]], rounds: int, warmup: int = 2) -> dict[str, list[float]]:
    """Milliseconds per call of each of ``calls``, ``rounds`` times, one call of each per round (after
    ``warmup`` untimed rounds: plans, shape caches, the allocator)."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(median, first quartile, third quartile)."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return median, q1, q3


def gradient_times_input(module, embed: Callable, run: Callable, target: Callable) -> Callable[[], Any]:
    """A fair torch autograd Gradient×Input: the module's weights need no gradient (only the input
    embeddings do), so the backward computes what an explanation needs and nothing more.
    ``embed()`` gives the input embeddings, ``run(embeddings)`` the logits, ``target(logits)`` the
    explained scalar."""
    module.requires_grad_(False)

    def call():
        words = embed().detach().requires_grad_(True)
        target(run(words)).backward()
        return (words * words.grad).sum(-1)
    return call


def rt_sentences(n: int, folder: Path) -> Path:
    """``folder/rt.csv``: the first ``n`` held-out Rotten Tomatoes sentences with their labels, as
    ``benchmarks/results/tune-demo/make_data.py`` writes them (a dataset job's input)."""
    path = folder / "rt.csv"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "results" / "tune-demo" / "make_data.py"), str(n),
                    str(path)], check=True, capture_output=True)
    return path


def job_lengths(model: Path, data: Path) -> list[int]:
    """The token count of each record of ``data`` as a dataset job on ``model`` counts it (what
    :func:`rulegraph.scale.batches.batches` cuts its batches by)."""
    from rulegraph.loaders import load
    from rulegraph.scale.data import encode, read_rows
    from rulegraph.text import TextEncoder
    examples, _ = encode(read_rows(data), TextEncoder.for_model(load(str(model)), str(model), None))
    return [e.length for e in examples]


def random_feeds(length: int, batch: int = 1) -> dict[str, Any]:
    """A BERT-style classifier's inputs for ``batch`` texts of ``length`` random token ids (seeded by the length):
    the cost per node of an explanation does not depend on which tokens they are."""
    import torch
    ids = torch.randint(1000, 5000, (batch, length), generator=torch.Generator().manual_seed(length))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}


def bert_gi(module, feeds: dict) -> Callable[[], Any]:
    """:func:`gradient_times_input` on a Hugging Face BERT-style classifier for ``feeds`` (input ids, mask, token
    types): the word embeddings in, the predicted class's logit explained."""
    return gradient_times_input(
        module, lambda: module.bert.embeddings.word_embeddings(feeds["input_ids"]),
        lambda words: module(inputs_embeds=words, attention_mask=feeds["attention_mask"],
                             token_type_ids=feeds["token_type_ids"]).logits,
        lambda logits: logits[0, logits[0].argmax()])


def serve(calls: dict[str, Callable[[], Any]], clocks: Callable[[], tuple[float, ...]]) -> None:
    """A benchmark worker's loop: each call made three times to warm up, ``ready`` printed, then for each case
    name read from stdin its call made and the change of each of ``clocks()`` over it printed on one line."""
    for call in calls.values():
        for _ in range(3):
            call()
    print("ready", flush=True)
    for line in sys.stdin:
        call = calls[line.strip()]
        before = clocks()
        call()
        print(*(b - a for a, b in zip(before, clocks())), flush=True)


def in_turn(workers: dict[str, subprocess.Popen], order: list[str], cases: list[str],
            rounds: int) -> dict[tuple[str, str], list[list[float]]]:
    """The figures :func:`serve` prints, per worker and case: each case asked of the workers in turn, call by
    call, in ``order`` and reversed every other round, so a loaded machine slows them alike; the workers then
    closed. A worker that does not say ``ready`` stops the benchmark."""
    for w in workers.values():
        if w.stdout.readline().strip() != "ready":
            raise SystemExit("a worker failed to start")
    got: dict[tuple[str, str], list[list[float]]] = {(n, c): [] for n in order for c in cases}
    for r in range(rounds):
        for c in cases:
            for n in order if r % 2 == 0 else order[::-1]:
                workers[n].stdin.write(c + "\n")
                workers[n].stdin.flush()
                got[n, c].append([float(x) for x in workers[n].stdout.readline().split()])
    for w in workers.values():
        w.stdin.close()
        w.wait()
    return got


def last_json(stdout: str) -> Any:
    """The last line of a child process's output that is a JSON object, read."""
    import json
    return json.loads(next(line for line in reversed(stdout.splitlines()) if line.startswith("{")))


def peak_rss(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 3600,
             python: str | None = None) -> dict[str, Any]:
    """Run ``python -c code args`` in a process of its own (``python``: another interpreter than this
    one): its wall seconds, peak resident memory (GiB, as the process itself reads it at its end) and
    standard output."""
    probe = "\nimport resource as _r\nprint('__peak_kib__', _r.getrusage(_r.RUSAGE_SELF).ru_maxrss)\n"
    started = time.perf_counter()
    run = subprocess.run([python or sys.executable, "-c", code + probe, *args], capture_output=True, text=True,
                         env={**os.environ, **(env or {})}, timeout=timeout)
    seconds = time.perf_counter() - started
    if run.returncode != 0:
        raise RuntimeError(f"the measured process failed ({run.returncode}): {run.stderr[-2000:]}")
    lines = run.stdout.splitlines()
    peak = next(int(line.split()[1]) for line in reversed(lines) if line.startswith("__peak_kib__"))
    return {"seconds": seconds, "peak_gib": peak / 2**20,
            "stdout": "\n".join(line for line in lines if not line.startswith("__peak_kib__"))}


def report(path: Path, title: str, conditions: list[str], header: list[str], rows: list[list[Any]]) -> str:
    """The results as Markdown (a title, the conditions, one table), printed and written to ``path``."""
    lines = [f"# {title}", "", *conditions, "", "| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"written to {path}")
    return text


def demo_shaped_bert() -> tuple[Any, Path]:
    """A BERT classifier of the demo model's shape (6 layers, hidden 384, 12 heads, 2 classes), random weights
    seeded, eager attention, exported to ONNX in a fresh folder: (the module in eval mode, the model path)."""
    import tempfile

    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from rulegraph.exporters import HFClassifier, export_onnx
    torch.manual_seed(0)
    config = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536,
                        attn_implementation="eager")
    module = BertForSequenceClassification(config).eval()
    example = {"input_ids": torch.randint(1000, 2000, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long),
               "token_type_ids": torch.zeros(2, 8, dtype=torch.long)}
    return module, export_onnx(HFClassifier(module), example, Path(tempfile.mkdtemp()) / "model.onnx")
