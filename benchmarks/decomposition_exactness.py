"""Reconstruction error of the decomposition per layer, float32 against float64, on the demo model.

    python benchmarks/decomposition_exactness.py [--lengths 10 128 512]
        [--out benchmarks/results/decomposition_exactness.md]

The table PyDec documents for its own decomposition, for rulegraph's: at every node the
decomposition pass checks that the components sum to the forward value; the table gives,
per layer, the largest |Σ components − value| over the layer's nodes relative to that
node's largest |value|. The model is the demo MiniLM (``make demo`` builds it) with the
shipped ``rules/decomposition.yaml`` (hybrid α, λ = 0.1, GELU gate as a coefficient), per-token
groups carried as components (``mode="components"``: every one of the T + 1 components
is checked). Inputs: the first demo sentence, and random token ids of the other lengths.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "sentiment"))

import train  # noqa: E402  (the demo model's cache)
import rulegraph  # noqa: E402
from rulegraph.text import TextEncoder  # noqa: E402

SENTENCE = "a gorgeous , witty , seductive movie ."


def inputs_of(length: int, encoder: TextEncoder) -> tuple[str, dict]:
    """The demo sentence where ``length`` is no longer than it, else random ids of ``length`` tokens."""
    enc = encoder.encode(SENTENCE)
    if length <= len(enc.tokens):
        return f"“{SENTENCE}” ({len(enc.tokens)} tokens)", enc.inputs
    ids = torch.randint(1000, 20000, (1, length), generator=torch.Generator().manual_seed(length))
    ids[0, 0], ids[0, -1] = 101, 102                     # [CLS] … [SEP]
    return f"random ids, {length} tokens", {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                            "token_type_ids": torch.zeros_like(ids)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[10, 128, 512])
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "decomposition_exactness.md")
    args = ap.parse_args()
    model = train.ensure_model()
    graph = rulegraph.load(model)
    encoder = TextEncoder.for_model(graph, model, None)
    lines = ["# Decomposition: reconstruction error per layer", "",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC · {platform.processor() or platform.machine()} · "
             f"torch {torch.__version__} · demo MiniLM, `rules/decomposition.yaml` (hybrid α, λ = 0.1), "
             "per-token groups, all components carried", "",
             "`python benchmarks/decomposition_exactness.py "
             f"--lengths {' '.join(map(str, args.lengths))}`", "",
             "Largest |Σ components − value| / max |value| over each layer's nodes.", ""]
    for length in args.lengths:
        what, feeds = inputs_of(length, encoder)
        tables = {}
        for dtype in (torch.float32, torch.float64):
            start = time.perf_counter()
            e = rulegraph.explain(graph, "decomposition", feeds, dtype=dtype, mode="components")
            tables[dtype] = ({r.name: r for r in e.audit.reconstruction}, time.perf_counter() - start)
            print(f"{what} {dtype}: max relative error {e.audit.max_relative_error:.2e} "
                  f"({tables[dtype][1]:.1f} s)", flush=True)
        (f32, t32), (f64, t64) = tables[torch.float32], tables[torch.float64]
        lines += [f"## {what}", "", f"float32 {t32:.1f} s, float64 {t64:.1f} s", "",
                  "| layer | nodes | float32 | float64 | worst node (float32) |", "|---|---:|---:|---:|---|"]
        for name, r in f32.items():
            lines.append(f"| {name} | {r.nodes} | {r.max_relative_error:.1e} | {f64[name].max_relative_error:.1e} "
                         f"| `{r.worst_node}` |")
        lines.append("")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
