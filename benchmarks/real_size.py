"""A real-size checkpoint end to end: export, check, explain — time and peak memory — against a Hugging
Face forward + backward Gradient×Input process on the same input.

    python benchmarks/real_size.py [--size 0.6b] [--lengths 128 1024] [--rules attnlrp]
        [--checkpoint-dtype float32] [--work DIR] [--out benchmarks/results/real_size-0.6b.md]
    python benchmarks/real_size.py --size tiny         # checks the script runs (seconds)

The model is a Llama-style causal LM with random weights (``--size``: ``0.6b`` is hidden 896, 24
layers, MLP 4,864, 14 query / 2 key-value heads, vocabulary 128,000 untied — 0.59 B parameters,
2.35 GB in float32, the size of issue 25; ``0.4b`` the same with a vocabulary of 32,000 and 28
layers — 0.41 B; ``0.6b-shallow`` 0.59 B parameters in 2 layers with a vocabulary of 320,000, the
weights' size with little arithmetic; ``tiny`` for a smoke run), saved with ``save_pretrained`` in ``--checkpoint-dtype``
under ``--work`` (outside the repository). Each measurement is its own process, so its peak RSS
(``ru_maxrss`` from ``wait4``) is its own:

* ``export``: ``rulegraph export`` (TorchScript exporter, the export check included; weights
  over 1 GiB go to ``model.onnx.data``);
* ``check``: ``rulegraph check -r RULES`` (loads, binds, counts the heads: one forward on 5 tokens);
* ``explain L``: ``rulegraph.explain`` of the next token after ``L`` random token ids (load +
  forward + relevance + audit, float32);
* ``HF GI L``: ``from_pretrained`` (eager attention, float32), then ``harness.gradient_times_input``:
  the weights need no gradient, the input embeddings do; forward, backward from the predicted token's
  logit, x·∂z/∂x summed per token.

Timings and memory are only meaningful on a quiet machine: the header records the load average
when the run started.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: size name → Llama config keywords
SIZES = {
    "0.6b": dict(hidden_size=896, num_hidden_layers=24, intermediate_size=4864, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=128_000),
    "0.4b": dict(hidden_size=896, num_hidden_layers=28, intermediate_size=4864, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=32_000),
    # the weights of 0.6b (0.59 B parameters, 2.36 GB in float32) in 2 layers: memory at that size with a
    # fraction of the arithmetic (export, load, check), for a machine where the full run would take too long
    "0.6b-shallow": dict(hidden_size=896, num_hidden_layers=2, intermediate_size=2432, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=320_000),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1_000),
}


# -- the measured children ---------------------------------------------------------------------------------

def _ids(length: int, vocab: int):
    import torch
    g = torch.Generator().manual_seed(length)
    ids = torch.randint(5, min(vocab, 30_000), (1, length), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def child_make(work: Path, size: str, dtype: str) -> dict:
    import torch
    import transformers
    sys.path.insert(0, str(REPO / "tests"))
    import tiny
    torch.manual_seed(0)
    config = transformers.LlamaConfig(max_position_embeddings=2048, tie_word_embeddings=False, pad_token_id=0,
                                      bos_token_id=None, eos_token_id=None, **SIZES[size])
    model = transformers.LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(work / "hf")
    tiny.lm_tokenizer().save(str(work / "hf" / "tokenizer.json"))
    return {"parameters": sum(p.numel() for p in model.parameters())}


def child_export(work: Path) -> dict:
    from rulegraph.cli import main
    code = main(["export", str(work / "hf"), str(work / "export"), "--force"])
    files = {p.name: p.stat().st_size for p in (work / "export").iterdir()}
    return {"exit": code, "files": files}


def child_check(work: Path, rules: str) -> dict:
    from rulegraph.cli import main
    return {"exit": main(["check", str(work / "export" / "model.onnx"), "-r", rules])}


def child_explain(work: Path, rules: str, length: int, vocab: int) -> dict:
    import torch
    import rulegraph
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    e = rulegraph.explain(work / "export" / "model.onnx", rules, _ids(length, vocab))
    c = e.audit.conservation
    return {"target": e.target[0], "relative_error": c.relative_error}


def child_hf(work: Path, length: int, vocab: int) -> dict:
    import torch
    import transformers
    sys.path.insert(0, str(REPO / "benchmarks"))
    from harness import gradient_times_input
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    model = transformers.AutoModelForCausalLM.from_pretrained(work / "hf", attn_implementation="eager",
                                                              dtype=torch.float32).eval()
    feeds = _ids(length, vocab)
    # the fair baseline: no weight gradients, the predicted token's logit (the max) explained
    gi = gradient_times_input(model, lambda: model.get_input_embeddings()(feeds["input_ids"]),
                              lambda w: model(inputs_embeds=w, attention_mask=feeds["attention_mask"],
                                              use_cache=False).logits,
                              lambda logits: logits[0, -1].max())
    gi()
    return {}


CHILDREN = {"make": child_make, "export": child_export, "check": child_check, "explain": child_explain,
            "hf": child_hf}


# -- the driver ---------------------------------------------------------------------------------------------

def measure(task: str, *args: str) -> dict:
    """Run one child process; its wall time, peak RSS (GiB) and what it reported."""
    report = Path(tempfile.mkstemp(suffix=".json")[1])
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, __file__, "--child", task, str(report), *args],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    error = process.stderr.read().decode(errors="replace").strip().splitlines()
    process.stderr.close()
    out = json.loads(report.read_text() or "{}") if report.exists() else {}
    report.unlink(missing_ok=True)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{task} failed: {error[-1] if error else os.waitstatus_to_exitcode(status)}")
    return {"task": task, "args": list(args), "seconds": wall, "peak_gib": usage.ru_maxrss / 2**20, **out}


def run(size: str, lengths: list[int], rules: str, dtype: str, work: Path) -> list[dict]:
    work.mkdir(parents=True, exist_ok=True)
    vocab = SIZES[size]["vocab_size"]
    rows = [measure("make", str(work), size, dtype), measure("export", str(work)),
            measure("check", str(work), rules)]
    for length in lengths:
        rows.append(measure("explain", str(work), rules, str(length), str(vocab)))
        rows.append(measure("hf", str(work), str(length), str(vocab)))
    return rows


def table(rows: list[dict], size: str, rules: str, dtype: str, load: tuple[float, float, float]) -> str:
    params = rows[0].get("parameters", 0)
    files = rows[1].get("files", {})
    lines = [
        f"# Real size: a Llama-style model of {params / 1e6:,.1f} M parameters ({size})",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, torch "
        f"{__import__('torch').__version__}, {platform.machine()}, {os.cpu_count()} CPUs; load average at start "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}; `python benchmarks/real_size.py --size {size} "
        f"--rules {rules} --checkpoint-dtype {dtype}`; one torch thread for explain and HF "
        "(BENCH_THREADS).",
        "",
        f"Checkpoint in {dtype}; export: " + ", ".join(f"{k} {v / 2**20:,.1f} MiB" for k, v in sorted(files.items())
                                                      if k.startswith("model")) + ".",
        "",
        "| process | tokens | wall s | peak RSS GiB | vs HF GI |",
        "|---|---:|---:|---:|---:|",
    ]
    hf = {int(r["args"][1]): r for r in rows if r["task"] == "hf"}
    for r in rows:
        if r["task"] == "make":
            continue
        tokens = int(r["args"][2]) if r["task"] == "explain" else int(r["args"][1]) if r["task"] == "hf" else None
        label = {"export": "rulegraph export (checked)", "check": f"rulegraph check -r {rules}",
                 "explain": f"rulegraph explain -r {rules} (audit on)", "hf": "HF forward + backward GI"}[r["task"]]
        ratio = ""
        if r["task"] == "explain" and tokens in hf:
            ratio = f"{r['seconds'] / hf[tokens]['seconds']:.2f}× time, {r['peak_gib'] / hf[tokens]['peak_gib']:.2f}× memory"
        lines.append(f"| {label} | {tokens or ''} | {r['seconds']:.1f} | {r['peak_gib']:.2f} | {ratio} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        task, report, *args = sys.argv[2:]
        fn = CHILDREN[task]
        converted = [Path(args[0]), *[int(a) if a.isdigit() else a for a in args[1:]]]
        out = fn(*converted)
        Path(report).write_text(json.dumps(out))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="0.6b")
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--rules", default="attnlrp")
    parser.add_argument("--checkpoint-dtype", dest="dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "rulegraph-real-size")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    load = os.getloadavg()
    rows = run(args.size, args.lengths, args.rules, args.dtype, args.work / args.size)
    text = table(rows, args.size, args.rules, args.dtype, load)
    out = args.out or REPO / "benchmarks" / "results" / f"real_size-{args.size}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(text)


if __name__ == "__main__":
    main()
