"""Many targets of one input: ``explain(…, targets=…)`` (one forward, one walk batched over a target axis:
``passes.relevance.walk_many``) against one ``explain`` call per target, side by side in one run, with one
torch thread and with two.

    python benchmarks/many_targets.py [--rounds 7] [--threads 1,2] [--out benchmarks/results/many_targets.md]

The case of the issue: every class of a 20-class head on a MiniLM-size BERT (6 layers, hidden 384,
12 heads; random weights, exported here with ``rulegraph export``'s exporter) at 94 tokens, with the
audit, for ``lrp-ah-ln``, ``attnlrp`` and ``gi``. Both ways give the same explanations (float64 to
1e-12 relative, ``tests/passes/test_many_targets.py``); this measures what one forward and one walk save.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from harness import REPO, interleave, machine, quartiles, report

CLASSES, TOKENS = 20, 94


def model(folder: Path) -> Path:
    """A MiniLM-size BERT classifier with ``CLASSES`` classes, random weights, exported once."""
    from transformers import BertConfig, BertForSequenceClassification
    from rulegraph.exporters import export_hf
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=1536, num_labels=CLASSES)
    BertForSequenceClassification(config).eval().save_pretrained(folder / "hf")
    sys.path.insert(0, str(REPO / "tests"))
    import tiny
    tiny.tokenizer().save(str(folder / "hf" / "tokenizer.json"))
    return export_hf(folder / "hf", folder / "export")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", default="1,2", help="torch thread counts, each measured in turn")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "many_targets.md")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    import rulegraph
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        graph = rulegraph.load(model(Path(tmp)))
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(5, 30000, (1, TOKENS), generator=g)
        feeds = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
        for count in threads:
            torch.set_num_threads(count)
            for rules in ("lrp-ah-ln", "attnlrp", "gi"):
                calls = {"one call, all targets": lambda: rulegraph.explain(graph, rules, feeds, targets="all"),
                         "a call per target": lambda: [rulegraph.explain(graph, rules, feeds, target=c)
                                                       for c in range(CLASSES)]}
                times = interleave(calls, args.rounds)
                (many, *_), (each, *_) = (quartiles(times[k]) for k in calls)
                rows.append([rules, count, f"{many:.0f}", f"{each:.0f}", f"{many / each:.2f}×"])
    report(args.out, "Many targets from one forward",
           [f"Measured {machine(' and '.join(map(str, threads)))}; {args.rounds} interleaved rounds, medians.",
            f"A MiniLM-size BERT (random weights) with a {CLASSES}-class head at {TOKENS} tokens, with the audit."],
           ["rule set", "torch threads", "targets='all' (ms)", f"{CLASSES} calls (ms)", "ratio"], rows)

if __name__ == "__main__":
    main()
