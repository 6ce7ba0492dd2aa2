"""Write the texts of the tune benchmark: N held-out Rotten Tomatoes sentences, from the FIRST-th on.

The held-out part is the one the demo model never trained on and that
``examples/sentiment/evaluate.py rt`` reads: ``data.rotten_tomatoes(seed=0)``'s
test split (1,706 sentences, a seeded stratified shuffle), N of them in order from
FIRST (default 0: the first N). Deterministic: the same N and FIRST give the same file
byte for byte.

    .venv/bin/python benchmarks/results/tune-demo/make_data.py N OUT.csv [FIRST]
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "sentiment"))
import data  # noqa: E402


def write(held_out: list, out: Path, n: int, first: int, what: str) -> None:
    """``held_out``'s (text, label) pairs from the ``first``-th, ``n`` of them, as a CSV file at ``out``."""
    chosen = held_out[first:first + n]
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerows(chosen)
    print(f"{out}: {len(chosen)} of {len(held_out)} held-out {what}, from the {first}-th")


if __name__ == "__main__":
    write(data.rotten_tomatoes(seed=0)[1], Path(sys.argv[2]), int(sys.argv[1]),
          int(sys.argv[3]) if len(sys.argv) > 3 else 0, "sentences")
