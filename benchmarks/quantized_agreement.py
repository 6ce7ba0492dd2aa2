"""How close an onnxruntime-quantized model's explanations are to the float model's.

    python benchmarks/quantized_agreement.py [--texts 60] [--out benchmarks/results/quantized_agreement.md]

The demo model (MiniLM fine-tuned on Rotten Tomatoes, ``examples/sentiment``) and the same model
quantized by onnxruntime's own tools: ``quantize_dynamic`` (int8 weights, activations quantized at
run time: DynamicQuantizeLinear + MatMulInteger) and ``quantize_static`` in QDQ format (int8 weights,
uint8 activations calibrated on 32 training sentences). For held-out test sentences, each rule set
explains the float model's predicted class in every model (float32); per sentence:

* Spearman rank correlation of the per-token scores with the float model's;
* top-k overlap: |top-k(quantized) ∩ top-k(float)| / k, k = max(1, round(20% of the tokens));
* the quantization error's share: |relevance absorbed by the quantization error| (the audit's
  ``quantization`` figure) over Σ|per-token score| of the same explanation, and whether the quantized
  model predicts the same class.

Numbers, not timings: the script may run on a busy machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import warnings
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "sentiment"))

import data  # noqa: E402
from train import ensure_model  # noqa: E402

import rulegraph  # noqa: E402
from rulegraph.text import TextEncoder  # noqa: E402

RULES = ("lrp-ah-ln", "attnlrp", "epsilon", "gi")


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = a.argsort().argsort().astype(float), b.argsort().argsort().astype(float)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = np.linalg.norm(ra) * np.linalg.norm(rb)
    return float((ra * rb).sum() / denominator) if denominator else 1.0


def overlap(a: np.ndarray, b: np.ndarray) -> float:
    k = max(1, round(0.2 * len(a)))
    return len(set(np.argsort(-a)[:k]) & set(np.argsort(-b)[:k])) / k


def quantized_models(model: Path, folder: Path, encoder: TextEncoder) -> dict[str, Path]:
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)
    train, _ = data.rotten_tomatoes()
    calibration = [encoder.encode(text).inputs for text, _ in train[:32]]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{k: v.numpy() for k, v in feeds.items()} for feeds in calibration])

        def get_next(self):
            return next(self.items, None)

    dynamic, static = folder / "dynamic.onnx", folder / "static-qdq.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(str(model), str(dynamic), weight_type=QuantType.QInt8)
        quantize_static(str(model), str(static), Reader(), quant_format=QuantFormat.QDQ,
                        weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
    return {"dynamic": dynamic, "static QDQ": static}


def measure(texts: int) -> tuple[dict, dict]:
    model = ensure_model()
    encoder = TextEncoder.for_model(rulegraph.load(model), model, None)
    _, test = data.rotten_tomatoes()
    sentences = [text for text, _ in test[:texts]]
    rows: dict = {}
    sizes: dict = {"float": model.stat().st_size}
    with tempfile.TemporaryDirectory() as scratch:
        variants = quantized_models(model, Path(scratch), encoder)
        sizes.update({k: v.stat().st_size for k, v in variants.items()})
        graphs = {"float": rulegraph.load(model), **{k: rulegraph.load(v) for k, v in variants.items()}}
        for text in sentences:
            feeds = encoder.encode(text).inputs
            for rules in RULES:
                reference = rulegraph.explain(graphs["float"], rules, feeds)
                base = np.asarray(reference.scores("input_ids"), dtype=float).ravel()
                for name in variants:
                    e = rulegraph.explain(graphs[name], rules, feeds, target=reference.target)
                    scores = np.asarray(e.scores("input_ids"), dtype=float).ravel()
                    row = rows.setdefault((name, rules), {"rho": [], "top": [], "share": [], "same": []})
                    row["rho"].append(spearman(scores, base))
                    row["top"].append(overlap(scores, base))
                    row["share"].append(abs(e.audit.quantization) / max(float(np.abs(scores).sum()), 1e-12))
                    row["same"].append(int(np.argmax(e.output_tensor.numpy()[0]) == reference.target[0]))
    return rows, sizes


def table(rows: dict, sizes: dict, texts: int) -> str:
    mib = {k: f"{v / 2**20:.1f} MiB" for k, v in sizes.items()}
    lines = [
        "# Quantized models: agreement with the float model's explanations",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}; "
        f"`python benchmarks/quantized_agreement.py --texts {texts}`.",
        "",
        f"The demo model (MiniLM fine-tuned on Rotten Tomatoes; {mib['float']}) quantized by onnxruntime: "
        f"`quantize_dynamic` ({mib['dynamic']}) and `quantize_static` in QDQ format ({mib['static QDQ']}). "
        f"{texts} held-out test sentences, the float model's predicted class explained in each, float32.",
        "",
        "| quantization | rule set | Spearman ρ: median [min] | top-20% overlap: mean [min] | "
        "quantization error / Σ|score|: median [max] | same prediction |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for (name, rules), r in rows.items():
        lines.append(f"| {name} | {rules} | {statistics.median(r['rho']):.3f} [{min(r['rho']):.3f}] | "
                     f"{statistics.mean(r['top']):.3f} [{min(r['top']):.2f}] | "
                     f"{statistics.median(r['share']):.1e} [{max(r['share']):.1e}] | "
                     f"{sum(r['same'])}/{len(r['same'])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=60)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "quantized_agreement.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows, sizes = measure(args.texts)
    text = table(rows, sizes, args.texts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
