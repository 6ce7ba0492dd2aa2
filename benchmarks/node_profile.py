"""Where a short explanation's time goes: per op kind, the kernels against the Python around them.

    python benchmarks/node_profile.py [--lengths 94 128] [--methods attnlrp lrp-ah-ln gi] [--rounds 10]
        [--out benchmarks/results/node_profile.md]

On the demo model (MiniLM-L6 + head, float32, batch 1, one thread), each explanation is split into its
phases (the forward ``Plan.run``, the relevance walk, the audit's ``finish`` and ``audit_of``, the rest:
binding, seed, boundary map, the explanation's tensors), timed with plain timers. Then, per op kind,
the forward's op functions (``OpSpec.forward`` / ``into``) and the walk's rules (``Rule.propagate``) are
wrapped in :func:`torch.profiler.record_function`; under the profiler, the ATen ops each one calls give its
*kernel* time (the ATen calls' own time: the kernels and torch's dispatch), the rest of its time is the
Python of the op or rule. What the walkers do around those calls (argument lists, the free schedule,
the audit's records) is the *interpreter* row: the phase's time less its calls; the audit's ledger
sums (``Ledger._entry``: the key, the weak references, the reduction) have their own row, and so do the
ATen calls the walk makes outside rules and ledger (relevance from several consumers summed). The profiler adds a few microseconds to every ATen call: its rows over-state kernel time on
small tensors; the phase rows (no profiler) are the ones to compare between versions.

Random token ids keep it free of any data set: the cost per node does
not depend on which tokens they are.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from harness import REPO, machine

sys.path.insert(0, str(REPO / "examples" / "sentiment"))

from train import ensure_model  # noqa: E402

import rulegraph  # noqa: E402
import rulegraph.passes.relevance as relevance  # noqa: E402
from rulegraph.interpreter import Plan  # noqa: E402
from rulegraph.ops.spec import OpSpec  # noqa: E402
from rulegraph.propagation import RULES  # noqa: E402

LABELS = ("F:", "R:", "A:")
PHASES = {"forward": (Plan, "run"), "walk": (relevance, "walk"), "finish": (relevance, "finish"),
          "audit_of": (relevance, "audit_of")}


def feeds_of(graph, length: int) -> dict[str, torch.Tensor]:
    names = {i.name for i in graph.inputs}
    feeds = {"input_ids": torch.randint(1000, 5000, (1, length), generator=torch.Generator().manual_seed(length)),
             "attention_mask": torch.ones(1, length, dtype=torch.long),
             "token_type_ids": torch.zeros(1, length, dtype=torch.long)}
    return {k: v for k, v in feeds.items() if k in names}


class Phases:
    """Wall time per phase of :func:`rulegraph.explain`, by wrapping the phase functions."""

    def __init__(self):
        self.times: dict[str, float] = collections.defaultdict(float)
        self.undo = []
        for name, (owner, attr) in PHASES.items():
            original = getattr(owner, attr)
            self.undo.append((owner, attr, original))
            setattr(owner, attr, self._timed(name, original))

    def _timed(self, name, fn):
        times = self.times

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                times[name] += time.perf_counter() - start
        return timed

    def close(self):
        for owner, attr, original in self.undo:
            setattr(owner, attr, original)


class Labels:
    """``record_function`` around every op function of the plan (``F:<op>``; ``R:<op>`` while the walk
    runs: a value it computes again) and every rule (``R:<op>``), for one profiled explanation."""

    def __init__(self, plan: Plan, binding):
        self.walking = False
        self.undo = []
        self.plan = plan
        self._forget()
        specs = {id(s.spec): s.spec for s in plan.steps}
        for spec in specs.values():
            for attr in ("forward", "into"):
                fn = getattr(spec, attr)
                if fn is not None:
                    self.undo.append((spec, attr, fn))
                    object.__setattr__(spec, attr, self._labelled(spec.name, fn))
        classes = {type(a.rule) for a in binding.assignments.values()}
        for cls in classes:            # (by class: the explanation binds its own rule objects)
            self.undo.append((cls, "propagate", cls.__dict__.get("propagate")))
            cls.propagate = self._rule(cls.propagate)
        entry = relevance.Ledger._entry
        self.undo.append((relevance.Ledger, "_entry", entry))

        def ledger_entry(ledger, key, tensors, compute, *rest):
            with torch.profiler.record_function("A:ledger sums"):
                return entry(ledger, key, tensors, compute, *rest)
        relevance.Ledger._entry = ledger_entry
        original = relevance.walk
        self.undo.append((relevance, "walk", original))

        def walk(*args, **kwargs):
            self.walking = True
            try:
                with torch.profiler.record_function("phase:walk"):
                    return original(*args, **kwargs)
            finally:
                self.walking = False
        relevance.walk = walk

    def _labelled(self, op, fn):
        def call(*args, **kwargs):
            with torch.profiler.record_function(("R:" if self.walking else "F:") + op):
                return fn(*args, **kwargs)
        return call

    def _rule(self, fn):
        # one rule can serve several ops: the label is the op of the site it is handed
        def call(rule, site):
            with torch.profiler.record_function("R:" + site.node.op):
                return fn(rule, site)
        return call

    def _forget(self):
        """Drop the plan's resolved programs (they hold the op functions they were made with)."""
        getattr(self.plan, "_programs", {}).clear()

    def close(self):
        self._forget()
        for owner, attr, fn in reversed(self.undo):
            if fn is None:
                delattr(owner, attr)
            elif isinstance(owner, OpSpec):
                object.__setattr__(owner, attr, fn)
            else:
                setattr(owner, attr, fn)


def kernel_us(event) -> float:
    """The time of the ATen calls under ``event``, down through nested labels (not into ATen's own children)."""
    total = 0.0
    for child in event.cpu_children:
        if child.name.startswith(LABELS):
            total += kernel_us(child)
        else:
            total += child.cpu_time_total
    return total


def per_kind(prof) -> dict[str, list[float]]:
    """label → [calls, wall µs, kernel µs], for the outermost labels."""
    rows: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for e in prof.events():
        if not e.name.startswith(LABELS):
            continue
        parent = e.cpu_parent
        while parent is not None and not parent.name.startswith(LABELS):
            parent = parent.cpu_parent
        if parent is not None:
            continue
        row = rows[e.name]
        row[0] += 1
        row[1] += e.cpu_time_total
        row[2] += kernel_us(e)
    return rows


def profile(graph, method: str, length: int, rounds: int) -> list[str]:
    feeds = feeds_of(graph, length)
    for _ in range(3):
        rulegraph.explain(graph, method, feeds)
    # phases, no profiler
    phases = Phases()
    totals = []
    try:
        for _ in range(rounds):
            start = time.perf_counter()
            rulegraph.explain(graph, method, feeds)
            totals.append(time.perf_counter() - start)
    finally:
        phases.close()
    per = {k: v / rounds * 1e3 for k, v in phases.times.items()}
    total = statistics.median(totals) * 1e3
    mean = statistics.fmean(totals) * 1e3
    lines = [f"### {method} at {length} tokens", "",
             f"explain: median {total:.1f} ms (mean {mean:.1f} ms over {rounds}); per phase (mean ms): " +
             ", ".join(f"{k} {per.get(k, 0.0):.1f}" for k in PHASES) +
             f", rest {mean - sum(per.get(k, 0.0) for k in ('forward', 'walk', 'audit_of')):.1f}", ""]
    # per op kind, under the profiler
    plan = rulegraph.prepare(graph)
    ruleset = rulegraph.RuleSet.load(method) if isinstance(method, str) else method
    binding = ruleset.bind(graph)
    labels = Labels(plan, binding)
    phases = Phases()
    try:
        rulegraph.explain(graph, method, feeds)
        phases.times.clear()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            rulegraph.explain(graph, method, feeds)
    finally:
        labels.close()
        phases.close()
    rows = per_kind(prof)
    wall = {"F": 0.0, "R": 0.0, "A": 0.0}
    kern = {"F": 0.0, "R": 0.0, "A": 0.0}
    steps = {"F": 0, "R": 0, "A": 0}
    table = []
    for name, (calls, us, k) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        wall[name[0]] += us
        kern[name[0]] += k
        steps[name[0]] += calls
        table.append([name, int(calls), us / 1e3, k / 1e3, (us - k) / 1e3, (us - k) / calls])
    lines += ["one explanation under torch.profiler (ms; the profiler's own cost inflates every row):", "",
              "| label | calls | wall | ATen | Python | Python µs/call |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.2f} | {r[4]:.2f} | {r[5]:.0f} |" for r in table[:18]]
    if len(table) > 18:
        rest = table[18:]
        lines.append(f"| ({len(rest)} more kinds) | {sum(r[1] for r in rest)} | {sum(r[2] for r in rest):.2f} | "
                     f"{sum(r[3] for r in rest):.2f} | {sum(r[4] for r in rest):.2f} | |")
    # ATen the walk calls outside the rules and the ledger: relevance arriving from several consumers summed
    # (Incoming.add), the seed's product
    outside = sum(c.cpu_time_total for e in prof.events() if e.name == "phase:walk"
                  for c in e.cpu_children if not c.name.startswith(LABELS))
    for key, phase in (("F", "forward"), ("R", "walk")):
        t = phases.times.get(phase, 0.0) * 1e3
        if key == "R":
            t -= outside / 1e3
            lines.append(f"| **walk: ATen outside rules and ledger** | | {outside / 1e3:.2f} | {outside / 1e3:.2f} | | |")
        lines.append(f"| **{phase}: ops/rules** | {steps[key]} | {wall[key] / 1e3:.2f} | {kern[key] / 1e3:.2f} | "
                     f"{(wall[key] - kern[key]) / 1e3:.2f} | |")
        around = t * 1e3 - wall[key] - (wall["A"] if key == "R" else 0.0)     # (the walk's ledger: its own row)
        lines.append(f"| **{phase}: interpreter around them** | | {around / 1e3:.2f} | | "
                     f"{around / 1e3:.2f} | {around / max(steps[key], 1):.0f} |")
    lines.append(f"| **walk: audit's ledger sums (A:)** | {steps['A']} | {wall['A'] / 1e3:.2f} | {kern['A'] / 1e3:.2f} | "
                 f"{(wall['A'] - kern['A']) / 1e3:.2f} | {(wall['A'] - kern['A']) / max(steps['A'], 1):.0f} |")
    lines.append("")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[94, 128])
    parser.add_argument("--methods", nargs="+", default=["attnlrp", "lrp-ah-ln", "gi"])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    graph = rulegraph.load(ensure_model())
    lines = ["# Per-node cost of a short explanation — demo model (MiniLM-L6 + head, float32, batch 1)", "",
             machine(1), ""]
    for method in args.methods:
        for length in args.lengths:
            lines += profile(graph, method, length, args.rounds)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
