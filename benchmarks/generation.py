"""Explaining every generated token: time and peak memory on a GPT-2-small-size random-weight model.

    taskset -c 1 python benchmarks/generation.py [--rounds 2] [--prompt 512] [--steps 32]
        [--long 2048] [--long-steps 4] [--out benchmarks/results/generation.md]
    python benchmarks/generation.py --rounds 0 --out benchmarks/results/generation-2048.md   # the long run alone

The model is GPT-2 small's shape (12 layers, 768 wide, 12 heads, vocabulary 50,257) with
random weights and 2,048 positions (GPT-2 small has 1,024; the long run needs more), saved with
``save_pretrained`` and exported by ``rulegraph export``'s exporter once (cached in
``.cache/bench-gpt2-small/``). The prompt is random token ids. Variants, each in its own
subprocess (so its peak RSS, ``VmHWM`` of ``/proc/self/status``, is its own), interleaved
round after round:

* ``rulegraph lrp-ah-ln, greedy``: ``rulegraph.generate(steps=N)``: per step one forward on the
  prefix, whose argmax is the next token and which the relevance walk then explains (audit on);
* ``rulegraph gi, greedy``: the same with the ``gi`` rule set (Gradient×Input);
* ``rulegraph lrp-ah-ln, continuation, batch 4``: the same tokens given as a continuation, four
  steps per call on the full sequence;
* ``torch autograd GI loop (HF)``: the Hugging Face module, per step a forward on the prefix
  with the input embeddings requiring grad, the argmax as the next token, backward from its
  logit, x·∂z/∂x summed per token.

All float32, one torch thread. Reported: the median time per step, the total per run (median
over rounds), setup time (loading the model and preparing the plan) and peak RSS. The long run
explains ``--long-steps`` steps after a prompt of ``--long`` − ``--long-steps`` + 1 tokens (the last step on
``--long`` tokens, the model's limit) to show it fits in memory.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from harness import cpu_name

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "bench-gpt2-small"
VOCAB = 50257
POSITIONS = 2048

#: variant name → (label, kind, rules, batch)
VARIANTS = {
    "rg-lrp": ("rulegraph lrp-ah-ln, greedy (audit on)", "rulegraph", "lrp-ah-ln", None),
    "rg-gi": ("rulegraph gi, greedy (audit on)", "rulegraph", "gi", None),
    "rg-lrp-batch4": ("rulegraph lrp-ah-ln, continuation, batch 4 (audit on)", "rulegraph", "lrp-ah-ln", 4),
    "hf-gi": ("torch autograd GI loop (HF module)", "hf", None, None),
}


def ensure_model() -> Path:
    """The random-weight GPT-2-small-size LM saved and exported once."""
    path = CACHE / "export" / "model.onnx"
    if path.exists():
        return path
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel

    from rulegraph.exporters import export_hf
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_embd=768, n_layer=12, n_head=12, n_positions=POSITIONS,
                        bos_token_id=None, eos_token_id=None, attn_implementation="eager")
    GPT2LMHeadModel(config).eval().save_pretrained(CACHE / "hf")
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(CACHE / "hf" / "tokenizer.json"))
    return export_hf(CACHE / "hf", CACHE / "export")


def prompt_ids(length: int):
    import torch
    return torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(length))


def rss_mib(field: str = "VmRSS") -> float:
    """This process's resident memory now (``VmRSS``) or at its peak (``VmHWM``, counted from its exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_variant(name: str, length: int, steps: int, tokens_file: Path) -> dict:
    """One run in this process: per-step times, the generated tokens, RSS."""
    import torch
    torch.set_num_threads(1)
    label, kind, rules, batch = VARIANTS[name]
    ids = prompt_ids(length)
    times: list[float] = []
    t0 = time.perf_counter()
    if kind == "rulegraph":
        import rulegraph
        graph = rulegraph.load(ensure_model())
        rulegraph.prepare(graph)
        setup = time.perf_counter() - t0
        loaded = rss_mib()
        last = [time.perf_counter()]

        def tick(k: int) -> None:
            now = time.perf_counter()
            times.extend([(now - last[0]) / k] * k)
            last[0] = now
        if batch is None:
            g = rulegraph.generate(graph, rules, inputs={"input_ids": ids}, steps=steps, progress=tick)
        else:
            given = json.loads(tokens_file.read_text())[:steps]
            g = rulegraph.generate(graph, rules, inputs={"input_ids": ids}, continuation=given, batch=batch,
                                   progress=tick)
        tokens = [s.token for s in g.steps]
        residual = max(abs(s.relative_error) for s in g.steps)
    else:
        from transformers import GPT2LMHeadModel
        model = GPT2LMHeadModel.from_pretrained(CACHE / "hf", attn_implementation="eager").eval()
        setup = time.perf_counter() - t0
        loaded = rss_mib()
        tokens, sequence = [], ids
        for _ in range(steps):
            start = time.perf_counter()
            x = model.get_input_embeddings()(sequence).detach().requires_grad_(True)
            logits = model(inputs_embeds=x, attention_mask=torch.ones_like(sequence), use_cache=False).logits
            token = int(logits[0, -1].argmax())
            logits[0, -1, token].backward()
            scores = (x * x.grad).sum(-1).detach()
            assert torch.isfinite(scores).all()
            tokens.append(token)
            sequence = torch.cat([sequence, torch.tensor([[token]])], 1)
            times.append(time.perf_counter() - start)
        residual = None
    peak = rss_mib("VmHWM")
    return {"variant": name, "length": length, "steps": steps, "times": times, "setup": setup, "tokens": tokens,
            "rss_loaded_mib": loaded, "peak_rss_mib": peak, "max_relative_residual": residual}


def spawn(name: str, length: int, steps: int, tokens_file: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--variant", name, "--prompt", str(length), "--steps", str(steps),
                          "--tokens", str(tokens_file)], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    if out.returncode != 0:
        raise RuntimeError(f"{name} at {length} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--long", type=int, default=2048)
    parser.add_argument("--long-steps", type=int, default=4)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--note", default="", help="a line for the results file (e.g. other jobs on the machine)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "generation.md")
    args = parser.parse_args(argv)
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.prompt, args.steps, args.tokens)))
        return 0
    started = time.perf_counter()
    ensure_model()
    tokens_file = CACHE / f"tokens-{args.prompt}.json"
    long_tokens = CACHE / f"tokens-{args.long}.json"
    long_tokens.write_text("[]")
    # the first greedy run's tokens are the continuation the batched variant explains, so greedy runs come
    # first in each round; the long runs follow the first round, so a slow machine still measures them
    variants = sorted(args.variants, key=lambda v: VARIANTS[v][3] is not None)
    jobs = [(r, v, args.prompt, args.steps) for r in range(args.rounds) for v in variants]
    if args.long:
        # the prompt leaves room for the steps: the last step's sequence is --long tokens (the model's limit)
        long_jobs = [(0, v, long_prompt(args), args.long_steps) for v in ("rg-lrp", "hf-gi") if v in variants]
        at = next((i for i, j in enumerate(jobs) if VARIANTS[j[1]][3] is not None), len(variants))
        jobs[at:at] = long_jobs
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    long_runs: dict[str, dict] = {}
    for r, v, length, steps in jobs:
        run = spawn(v, length, steps, tokens_file if length == args.prompt else long_tokens)
        if length == args.prompt:
            runs[v].append(run)
            if not tokens_file.exists() or (r == 0 and v == variants[0]):
                tokens_file.write_text(json.dumps(run["tokens"]))
        else:
            long_runs[v] = run
        print(f"round {r + 1} {v} at {length}: {sum(run['times']):.1f} s", file=sys.stderr, flush=True)
        report(args, runs, long_runs, started)
    return 0


def long_prompt(args) -> int:
    """The long run's prompt length: its last step explains a sequence of ``--long`` tokens."""
    return args.long - args.long_steps + 1


def report(args, runs: dict[str, list[dict]], long_runs: dict[str, dict], started: float) -> None:
    """Write the results file from the runs so far (rewritten after every run)."""
    import onnxruntime
    import torch
    done = {v: rs for v, rs in runs.items() if rs}
    first = next(iter(done.values()))[0] if done else None
    lines = [f"# explaining generation — GPT-2-small-size random-weight LM (12 layers, 768 wide, 12 heads, vocabulary "
             f"{VOCAB}), float32, batch 1",
             "",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC · {cpu_name()} · 1 torch thread · "
             f"CPU affinity {sorted(os.sched_getaffinity(0))} · torch {torch.__version__} · onnxruntime "
             f"{onnxruntime.__version__} · {args.rounds} round(s), variants interleaved, each run in its own process · "
             f"benchmark so far {(time.perf_counter() - started) / 60:.1f} min",
             ""]
    if args.note:
        lines += [args.note, ""]
    if done:
        lines += [f"## {args.steps} generated tokens after a {args.prompt}-token prompt (random token ids)", "",
                  "| variant | per step (median) | per step (min–max) | run total (median over rounds) | setup | "
                  "peak RSS | RSS after setup | same tokens as greedy | max relative residual |",
                  "|---|---:|---:|---:|---:|---:|---:|:-:|---:|"]
    for v, rs in done.items():
        per_step = [t for run in rs for t in run["times"]]
        total = statistics.median(sum(run["times"]) for run in rs)
        residual = max((run["max_relative_residual"] for run in rs if run["max_relative_residual"] is not None),
                       default=None)
        agree = all(run["tokens"] == first["tokens"] for run in rs)
        lines.append(f"| {VARIANTS[v][0]} | {statistics.median(per_step):.2f} s | {min(per_step):.2f}–"
                     f"{max(per_step):.2f} s | {total:.1f} s | {statistics.median(r['setup'] for r in rs):.1f} s | "
                     f"{max(r['peak_rss_mib'] for r in rs) / 1024:.2f} GiB | "
                     f"{max(r['rss_loaded_mib'] for r in rs) / 1024:.2f} GiB | {'yes' if agree else 'NO'} | "
                     f"{'—' if residual is None else f'{residual:.1e}'} |")
    if "rg-lrp" in done and "hf-gi" in done:
        ratio = statistics.median(t for r in done["rg-lrp"] for t in r["times"]) / \
            statistics.median(t for r in done["hf-gi"] for t in r["times"])
        lines += ["", f"rulegraph lrp-ah-ln (with the audit) / torch autograd GI, per step: **{ratio:.2f}×**"]
    if long_runs:
        lines += ["", f"## {long_prompt(args)}-token prompt, {args.long_steps} generated tokens: sequences up to "
                      f"{args.long} tokens (fewer steps than above: one "
                      "run, to show the memory it takes)", "",
                  "| variant | per step (median) | peak RSS | RSS after setup | max relative residual |",
                  "|---|---:|---:|---:|---:|"]
        for v, run in long_runs.items():
            residual = run["max_relative_residual"]
            lines.append(f"| {VARIANTS[v][0]} | {statistics.median(run['times']):.1f} s | "
                         f"{run['peak_rss_mib'] / 1024:.2f} GiB | {run['rss_loaded_mib'] / 1024:.2f} GiB | "
                         f"{'—' if residual is None else f'{residual:.1e}'} |")
    lines += ["", "Each rulegraph step is one forward on the prefix (its argmax is the next token) and one relevance "
                  "walk; the continuation variant explains the same tokens on the full sequence, four steps per "
                  "call (four copies of the sequence in a batch). The HF loop computes logits at every position, as "
                  "the module does by default; so does the exported graph. Peak RSS is the process's VmHWM (model "
                  "and weights included).", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
