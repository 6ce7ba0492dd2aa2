"""Would compiling the replayed walk pay on a CPU? Its trace (``replay=True``) compiled by TorchInductor, timed.

    python benchmarks/replay_compiled.py [--length 94] [--rules attnlrp] [--rounds 10]
        [--out benchmarks/results/replay_compiled.md]

On the demo-shaped BERT (random weights, 6 layers × 384, float32, batch 1, one thread), the relevance walk of
one explanation is traced as ``replay=True`` traces it (:func:`rulegraph.passes.relevance.traced_walk`), then
run three ways on the same forward values, interleaved: by the interpreter's walker (the traced function
itself, unchanged), as the traced graph (what a CPU replay runs) and compiled by TorchInductor
(``torch._inductor.compile_fx``, C++ kernels fusing the elementwise work). The table gives each one's median
and the compile's one-off cost, and the largest relative difference of the compiled walk's outputs.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from harness import demo_shaped_bert, machine, report

from rulegraph.passes import base
from rulegraph.passes.relevance import RelevancePass, traced_walk
from rulegraph.passes.replay import Replay
from rulegraph.tolerances import tolerance


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=94)
    parser.add_argument("--rules", default="attnlrp")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "replay_compiled.md")
    args = parser.parse_args(argv)
    from torch._inductor.compile_fx import compile_fx
    from torch.fx.experimental.proxy_tensor import make_fx
    torch.set_num_threads(1)
    _, path = demo_shaped_bert()
    length = args.length
    feeds = {"input_ids": torch.randint(1000, 2000, (1, length)),
             "attention_mask": torch.ones(1, length, dtype=torch.long),
             "token_type_ids": torch.zeros(1, length, dtype=torch.long)}
    graph, ruleset = base.prepared(str(path), args.rules)
    forward = base.forward(graph, ruleset, feeds, None, output=None, position=None, device="cpu",
                           dtype=torch.float32, chosen=RelevancePass)
    plan, values = forward.plan, forward.values
    kept = Replay.traced(plan, plan.feeds(feeds), values, RelevancePass.keeps(forward.binding, plan),
                         RelevancePass.spills(forward.binding, plan)).kept
    kept = tuple(v for v in kept if v in values)
    function, _ = traced_walk(forward.binding, plan, values, kept, forward.output, True, tolerance(torch.float32))
    inputs = [forward.seed, *(values[v] for v in kept)]
    start = time.perf_counter()
    traced = make_fx(function, tracing_mode="fake", _allow_non_fake_inputs=True)(*inputs)
    trace_s = time.perf_counter() - start
    start = time.perf_counter()
    compiled = compile_fx(traced, inputs)
    reference = function(*inputs)
    out = compiled(*inputs)
    compile_s = time.perf_counter() - start
    worst = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for a, b in zip(out, reference))
    calls = {"the walker (interpreter)": lambda: function(*inputs), "the traced graph (a CPU replay)":
             lambda: traced(*inputs), "compiled by TorchInductor": lambda: compiled(*inputs)}
    times: dict[str, list[float]] = {k: [] for k in calls}
    for r in range(args.rounds + 2):
        for key, call in calls.items():
            begin = time.perf_counter()
            call()
            if r >= 2:
                times[key].append(time.perf_counter() - begin)
    base_ms = statistics.median(times["the walker (interpreter)"]) * 1e3
    rows = [[key, f"{statistics.median(t) * 1e3:.1f}", f"{statistics.median(t) * 1e3 / base_ms:.2f}×"]
            for key, t in times.items()]
    rows += [["one-off: the trace", f"{trace_s * 1e3:.0f}", ""],
             ["one-off: TorchInductor's compile", f"{compile_s * 1e3:.0f}", ""]]
    report(args.out, "The replayed walk compiled by TorchInductor, on the CPU",
           [machine(1), f"the demo-shaped BERT (random weights), {args.rules} with the audit, {length} tokens, "
                        f"float32, batch 1; the walk alone, medians of {args.rounds} interleaved rounds (ms); "
                        f"the compiled walk's outputs differ by at most {worst:.1e} of their largest"],
           ["the walk run by", "ms", "vs the walker"], rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
