"""Precision per dtype: conservation error and agreement with float64, measured side by side.

    python benchmarks/dtype_precision.py [--inputs 5] [--out benchmarks/results/dtype_precision.md]

Tiny random Llama and GPT-2 causal LMs (tests/tiny.py) saved with ``save_pretrained`` in bfloat16
and in float16, exported with ``rulegraph export`` (the weights stay in the checkpoint's dtype),
then explained with every shipped rule set in float64, float32, bfloat16 and float16 (the next
token at the last of 12 positions, ``--inputs`` random inputs). Per compute dtype and rule set:

* graph error: the largest |unexplained residual| / |explained output| (the audit's figure);
* node error: the largest relative error of a conserving node (what the tolerance flags);
* vs float64: the largest |score − score₆₄| over max |score₆₄| of the same checkpoint, and the
  smallest Spearman rank correlation of the per-token scores with float64's.

Numbers, not timings: the script may run on a busy machine.
"""
from __future__ import annotations

import argparse
import platform
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import tiny  # noqa: E402

import rulegraph  # noqa: E402
from rulegraph.exporters import export_hf  # noqa: E402
from rulegraph.tolerances import TOLERANCE  # noqa: E402

COMPUTE = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
CHECKPOINTS = (torch.bfloat16, torch.float16)
KINDS = ("llama", "gpt2")


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = a.argsort().argsort().double(), b.argsort().argsort().double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def measure(inputs: int) -> dict:
    """{(compute dtype, rule set): [graph error, node error, score error, min rank correlation]} over
    every architecture and checkpoint dtype."""
    rows: dict = {}
    scratch = Path(tempfile.mkdtemp(prefix="rulegraph-dtype-"))
    try:
        for kind in KINDS:
            for saved in CHECKPOINTS:
                folder = scratch / f"{kind}-{str(saved).removeprefix('torch.')}"
                tiny.causal_lm(kind).to(saved).save_pretrained(folder / "hf")
                tiny.lm_tokenizer().save(str(folder / "hf" / "tokenizer.json"))
                graph = rulegraph.load(export_hf(folder / "hf", folder / "export"))
                for seed in range(inputs):
                    feeds = tiny.token_inputs(("input_ids", "attention_mask"), batch=1, length=12, seed=seed + 1)
                    for rules in sorted(rulegraph.shipped_rule_sets()):
                        reference = None
                        for dtype in COMPUTE:
                            e = rulegraph.explain(graph, rules, feeds, dtype=dtype)
                            scores = torch.as_tensor(e.scores("input_ids"), dtype=torch.float64).flatten()
                            if dtype == torch.float64:
                                reference = scores
                            c, a = e.audit.conservation, e.audit
                            graph_error = abs(c.residual) / max(abs(c.output_value), 1e-30)
                            node_error = max((n.relative_error for n in a.nodes if n.conserving), default=0.0) \
                                if hasattr(a.nodes[0] if a.nodes else None, "conserving") else 0.0
                            score_error = float((scores - reference).abs().max() / reference.abs().max())
                            rank = spearman(scores, reference)
                            row = rows.setdefault((dtype, rules), [0.0, 0.0, 0.0, 1.0])
                            row[0] = max(row[0], graph_error)
                            row[1] = max(row[1], node_error)
                            row[2] = max(row[2], score_error)
                            row[3] = min(row[3], rank)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return rows


def table(rows: dict, inputs: int) -> str:
    lines = [
        "# Precision per dtype",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}, {platform.machine()}; "
        f"`python benchmarks/dtype_precision.py --inputs {inputs}`.",
        "",
        f"Tiny random {' and '.join(KINDS)} causal LMs saved in "
        f"{' and '.join(str(d).removeprefix('torch.') for d in CHECKPOINTS)}, exported, explained at the last of "
        f"12 positions ({inputs} random inputs each); the largest figure over architectures, checkpoints and "
        "inputs (the smallest rank correlation).",
        "",
        "| compute dtype | rule set | graph error | node error | tolerance | score error vs float64 | "
        "Spearman vs float64 |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (dtype, rules), (g, n, s, r) in rows.items():
        name = str(dtype).removeprefix("torch.")
        lines.append(f"| {name} | {rules} | {g:.1e} | {n:.1e} | {TOLERANCE[dtype]:.0e} | {s:.1e} | {r:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "dtype_precision.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    text = table(measure(args.inputs), args.inputs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
