"""The softmax VJP ``s ⊙ (g − Σ g ⊙ s)``: torch's fused backward kernel (a private function,
``torch._softmax_backward_data``, the one autograd runs) against the plain expression.

    python benchmarks/softmax_backward.py [--rounds 30]

Both run side by side, interleaved, on attention-shaped tensors [1, heads, T, T] in float32,
at 1 and 2 threads; the medians and their ratio go to benchmarks/results/softmax_backward.md.
rulegraph keeps the private kernel only where it is measurably faster (``rulegraph/ops/nn.py``).
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch


def fused(g, s, dim):
    return torch._softmax_backward_data(g, s, dim, s.dtype)


def plain(g, s, dim):
    return s * (g - (g * s).sum(dim, keepdim=True))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args()
    rows = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for length in (128, 512):
            gen = torch.Generator().manual_seed(0)
            s = torch.softmax(torch.randn(1, 12, length, length, generator=gen), -1)
            g = torch.randn(1, 12, length, length, generator=gen)
            assert torch.allclose(fused(g, s, -1), plain(g, s, -1), rtol=1e-5, atol=1e-7)
            times = {"fused": [], "plain": []}
            for _ in range(3):
                fused(g, s, -1), plain(g, s, -1)
            for _ in range(args.rounds):
                for name, fn in (("fused", fused), ("plain", plain)):
                    t0 = time.perf_counter()
                    fn(g, s, -1)
                    times[name].append(time.perf_counter() - t0)
            f, q = statistics.median(times["fused"]), statistics.median(times["plain"])
            rows.append((threads, length, f * 1e3, q * 1e3, q / f))
            print(f"threads {threads}  T={length}: fused {f * 1e3:.2f} ms, plain {q * 1e3:.2f} ms, plain/fused {q / f:.2f}×")
    out = Path(__file__).parent / "results" / "softmax_backward.md"
    lines = ["# Softmax VJP: fused kernel vs plain expression\n",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC · {platform.machine()} · torch {torch.__version__} · "
             f"[1, 12, T, T] float32 · median of {args.rounds} interleaved rounds\n",
             "| threads | T | fused (`torch._softmax_backward_data`) | plain `s·(g − Σ g·s)` | plain / fused |",
             "|---:|---:|---:|---:|---:|"]
    lines += [f"| {t} | {n} | {f:.2f} ms | {q:.2f} ms | {r:.2f}× |" for t, n, f, q, r in rows]
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
