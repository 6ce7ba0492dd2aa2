"""What the conservation audit costs, per rule: the ledger's sums timed by the rule of the node that took them.

    python benchmarks/audit_cost.py [--lengths 94 128] [--methods attnlrp lrp-ah-ln gi] [--rounds 10]
        [--out benchmarks/results/audit_cost.md]

On the demo model (MiniLM-L6 + head, float32, batch 1, one thread), each explanation runs with the audit and
without, interleaved: the difference of their medians is what the audit costs in all (its sums, its records,
the absorbed shares the rules compute only for it, the verdicts). In the audited runs every ledger sum
(``Ledger._entry``: the key, the weak references, the reduction, read at once on the CPU) is timed and charged
to the rule of the node whose visit took it (``RelevanceWalk.visit``; the seed's, before the first visit, to
``seed``), with the number of sums and the elements they read. Random token ids keep it free of any data set.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time

import torch

from harness import REPO, machine, report

sys.path.insert(0, str(REPO / "examples" / "sentiment"))

from train import ensure_model  # noqa: E402

import rulegraph  # noqa: E402
import rulegraph.passes.relevance as relevance  # noqa: E402
from node_profile import feeds_of  # noqa: E402


class Charged:
    """The ledger's sums timed and charged to the rule of the node being visited."""

    def __init__(self):
        self.rule = "seed"
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.sums: dict[str, int] = collections.defaultdict(int)
        self.elements: dict[str, int] = collections.defaultdict(int)
        self.on = False
        entry, visit = relevance.Ledger._entry, relevance.RelevanceWalk.visit
        charged = self

        def timed_entry(ledger, key, tensors, compute, *rest):
            if not charged.on:
                return entry(ledger, key, tensors, compute, *rest)
            start = time.perf_counter()
            try:
                return entry(ledger, key, tensors, compute, *rest)
            finally:
                charged.seconds[charged.rule] += time.perf_counter() - start
                charged.sums[charged.rule] += 1
                charged.elements[charged.rule] += max((t.numel() for t in tensors), default=0)

        def named_visit(walk, step, life):
            if step.rule is not None:
                charged.rule = step.rule.name
            return visit(walk, step, life)

        relevance.Ledger._entry = timed_entry
        relevance.RelevanceWalk.visit = named_visit


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[94, 128])
    parser.add_argument("--methods", nargs="+", default=["attnlrp", "lrp-ah-ln", "gi"])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "audit_cost.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    graph = rulegraph.load(str(ensure_model()))
    charged = Charged()
    rows = []
    for length in args.lengths:
        feeds = feeds_of(graph, length)
        for method in args.methods:
            times = {True: [], False: []}
            per_round: list[dict[str, float]] = []
            for r in range(args.rounds + 2):
                for audit in (True, False):
                    charged.seconds.clear(), charged.sums.clear(), charged.elements.clear()
                    charged.on, charged.rule = audit, "seed"
                    start = time.perf_counter()
                    rulegraph.explain(graph, method, feeds, audit=audit)
                    took = time.perf_counter() - start
                    if audit:
                        sums, elements = dict(charged.sums), dict(charged.elements)
                    if r >= 2:                  # two warm-up rounds
                        times[audit].append(took)
                        if audit:
                            per_round.append(dict(charged.seconds))
            on, off = statistics.median(times[True]) * 1e3, statistics.median(times[False]) * 1e3
            by_rule = {rule: statistics.median(p.get(rule, 0.0) for p in per_round) * 1e3 for rule in sums}
            rows.append([length, method, "whole explanation, audit on / off", f"{on:.1f} / {off:.1f}",
                         "", "", f"audit {on - off:.1f} ms ({(on - off) / on:.0%})"])
            for rule, ms in sorted(by_rule.items(), key=lambda kv: -kv[1]):
                rows.append([length, method, f"sums at `{rule}` nodes", f"{ms:.2f}", sums[rule],
                             f"{elements[rule] / 1e6:.2f} M", f"{ms / (on - off):.0%} of the audit"
                             if on > off else ""])
            rows.append([length, method, "all sums", f"{sum(by_rule.values()):.2f}", sum(sums.values()),
                         f"{sum(elements.values()) / 1e6:.2f} M", ""])
            print(f"{length} {method}: audit {on - off:.1f} ms of {on:.1f}", file=sys.stderr)
    report(args.out, "What the audit costs, per rule",
           [machine(1), f"the demo model, float32, batch 1; medians of {args.rounds} interleaved rounds (ms) "
                        "after 2 warm-ups; a sum's elements: the largest tensor it reads"],
           ["tokens", "rule set", "what", "ms", "sums", "elements read", "share"], rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
