"""Write the texts of the IMDB language model's tune benchmark: N held-out prefixes, from the FIRST-th on.

The texts are those ``examples/lm/evaluate.py`` evaluates (its ``texts``): from the held-out 20% of
the IMDB reviews (never trained on), after the first 500 (which measured the perplexity), the first
sentence of each review with 8 to 40 words, cut before its last word, kept at 10 to 48 tokens; N of
them in order from FIRST (default 0: the first N, which the evaluation's first N are too).
Deterministic: the same N and FIRST give the same file byte for byte. Needs the trained model's
tokenizer (``examples/lm/train.py`` trains it first if it is not cached).

    .venv/bin/python benchmarks/results/tune-imdb-lm/make_data.py N OUT.csv [FIRST]
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "lm"))
import evaluate  # noqa: E402  (examples/lm/evaluate.py)

n, out = int(sys.argv[1]), Path(sys.argv[2])
first = int(sys.argv[3]) if len(sys.argv) > 3 else 0
chosen = evaluate.texts(first + n)[first:]
out.parent.mkdir(parents=True, exist_ok=True)
with out.open("w", newline="", encoding="utf-8") as handle:
    writer = csv.writer(handle)
    writer.writerow(["text"])
    writer.writerows([text] for text in chosen)
print(f"{out}: {len(chosen)} held-out prefixes, from the {first}-th")
