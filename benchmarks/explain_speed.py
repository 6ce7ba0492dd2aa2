"""Time per explanation on the demo model, side by side in one process.

    python benchmarks/explain_speed.py [--rounds 30] [--lengths 94 512] [--threads 1] [--compiled]
        [--out benchmarks/results/explain_speed.md]

Rows: onnxruntime forward; rulegraph forward; rulegraph ``lrp-ah-ln`` explain (with
its conservation audit, the default, and without); torch autograd Gradient×Input on
the original Hugging Face module (forward + backward to the word embeddings). All
float32, batch 1, on real text cut to the given token count. The methods run
interleaved, round after round, so a busy machine slows them alike; the table shows
the median and the interquartile range. The autograd baseline computes no weight gradients
(:func:`harness.gradient_times_input`), as an explanation needs none. Targets: explain ≤ 1.2×
torch GI and ≤ 3× onnxruntime forward; rulegraph's forward ≤ 1.3× onnxruntime's. ``--compiled``: also the
explanation with the audit replayed from traces TorchInductor compiled (``compiled=True``), its first call at
each length (the trace and the compile) timed apart, and the forward alone replayed compiled (issue 44's target:
≤ 1.2× onnxruntime's).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import onnxruntime as ort
import torch

from harness import REPO, bert_gi, interleave, machine, quartiles, report

sys.path.insert(0, str(REPO / "examples" / "sentiment"))

import data  # noqa: E402
from train import ensure_model  # noqa: E402

import rulegraph  # noqa: E402
from rulegraph.passes.replay import run_forward  # noqa: E402
from rulegraph.text import TextEncoder  # noqa: E402


COMPILED_ROW = "rulegraph explain lrp-ah-ln (with audit, compiled)"
COMPILED_FORWARD = "rulegraph forward (compiled)"


def inputs_of_length(encoder: TextEncoder, length: int) -> dict[str, torch.Tensor]:
    """Real review text (IMDB test split) cut to exactly ``length`` tokens, [CLS] … [SEP] kept."""
    _, test = data.imdb()
    text = " ".join(text for text, _ in test[:20])
    encoder.max_length = length
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = encoder.encode(text)
    assert enc.inputs["input_ids"].shape[1] == length
    return enc.inputs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--lengths", type=int, nargs="+", default=[94, 512])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch's and onnxruntime's threads (issue 29's forward target is at 1)")
    parser.add_argument("--compiled", action="store_true", help="also compiled=True (a first call of tens of "
                        "seconds per length)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "explain_speed.md")
    args = parser.parse_args(argv)
    threads = args.threads
    torch.set_num_threads(threads)

    model_path = ensure_model()
    graph = rulegraph.load(model_path)
    rules = rulegraph.RuleSet.load("lrp-ah-ln")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    # onnxruntime's workers spin after each run by default, taking the cores from whatever runs next
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    plan = rulegraph.prepare(graph)
    binding = rules.bind(graph)
    from transformers import BertForSequenceClassification
    module = BertForSequenceClassification.from_pretrained(model_path.parent / "hf", attn_implementation="eager").eval()
    encoder = TextEncoder(model_path.parent / "tokenizer.json")

    rows = []
    for length in args.lengths:
        feeds = inputs_of_length(encoder, length)
        numpy_feeds = {k: v.numpy() for k, v in feeds.items()}

        torch_gi = bert_gi(module, feeds)
        methods = {
            "onnxruntime forward": lambda: session.run(None, numpy_feeds),
            "rulegraph forward": lambda: plan.run(feeds, keep=frozenset()),
            "rulegraph explain lrp-ah-ln (with audit)": lambda: rulegraph.explain(graph, rules, feeds),
            "rulegraph explain lrp-ah-ln (no audit)": lambda: rulegraph.explain(graph, rules, feeds, audit=False),
            "torch autograd GI (HF module, no weight gradients)": torch_gi,
        }
        first = None
        if args.compiled:
            methods = {COMPILED_ROW: lambda: rulegraph.explain(graph, rules, feeds, compiled=True),
                       COMPILED_FORWARD: lambda: run_forward(binding, plan, feeds, frozenset(), frozenset(),
                                                             compiled=True),
                       **methods}
            start = time.perf_counter()
            methods[COMPILED_ROW]()
            first = time.perf_counter() - start
            start = time.perf_counter()
            methods[COMPILED_FORWARD]()
            first_forward = time.perf_counter() - start
        times = interleave(methods, args.rounds if length <= 128 else max(5, args.rounds // 3))
        for name, ts in times.items():
            median, q1, q3 = quartiles(ts)
            rows.append([length, name, f"{median:.1f} ms", f"{q1:.1f}–{q3:.1f} ms"])
        explain = statistics.median(times["rulegraph explain lrp-ah-ln (with audit)"])
        gi = statistics.median(times["torch autograd GI (HF module, no weight gradients)"])
        rows.append([length, "ratio explain / torch GI (target ≤ 1.2)", f"**{explain / gi:.2f}×**", ""])
        ort_forward = statistics.median(times["onnxruntime forward"])
        rows.append([length, "ratio explain / onnxruntime forward (target ≤ 3)", f"**{explain / ort_forward:.2f}×**", ""])
        rows.append([length, "ratio rulegraph forward / onnxruntime forward (target ≤ 1.3)",
                     f"**{statistics.median(times['rulegraph forward']) / ort_forward:.2f}×**", ""])
        if first is not None:
            rows.append([length, "ratio compiled explain / torch GI",
                         f"**{statistics.median(times[COMPILED_ROW]) / gi:.2f}×**", ""])
            rows.append([length, "ratio compiled forward / onnxruntime forward",
                         f"**{statistics.median(times[COMPILED_FORWARD]) / ort_forward:.2f}×**", ""])
            rows.append([length, "compiled explain: first call (trace and compile)", f"{first:.1f} s", ""])
            rows.append([length, "compiled forward: first call (trace and compile)", f"{first_forward:.1f} s", ""])
    report(args.out, "explain speed — demo model (MiniLM-L6 + head, float32, batch 1)",
           [f"{machine(threads)} · {args.rounds} rounds (fewer above 128 tokens), interleaved"],
           ["tokens", "method", "median", "IQR"], rows)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
