"""Peak memory of an explanation: rulegraph's AttnLRP beside LXT's and a torch autograd Gradient×Input.

    python benchmarks/memory.py [--models gpt2-small llama-100m] [--lengths 256 1024 2048]
        [--lxt-python PYTHON] [--work DIR] [--out benchmarks/results/memory.md]
    python benchmarks/memory.py --models tiny --lengths 16          # checks the script runs (seconds)

Two random-weight causal LMs built from ``transformers`` configs (nothing downloaded): GPT-2 small's
shape (12 layers, 768 wide, 12 heads, vocabulary 50,257, 2,048 positions) and a Llama-style model of
about 100 M parameters (RMSNorm, rotary positions, SwiGLU, 12 query / 4 key-value heads, 768 wide,
8 layers, MLP 2,048, vocabulary 32,000 untied). Each is saved with ``save_pretrained`` and exported
by rulegraph's exporter once under ``--work`` (outside the repository).

Every measurement is a process of its own (:func:`harness.peak_rss`), explaining the next token after
``L`` random token ids (the predicted one, at the last position), float32, one torch thread:

* ``rulegraph attnlrp``: the exported ONNX file loaded and its plan prepared (RSS after loading),
  then ``rulegraph.explain(graph, "attnlrp", …)`` with the audit on, and with it off;
* ``autograd GI``: the Hugging Face module (eager attention) loaded, then
  :func:`harness.gradient_times_input` — the weights need no gradient, the input embeddings do;
* ``LXT AttnLRP``: the same module after ``lxt.efficient.monkey_patch`` of its modeling file, the
  same Gradient×Input backward; run by ``--lxt-python`` (an environment where ``lxt`` imports: LXT
  2.1 needs transformers 4.x), skipped when that interpreter cannot import it.

Peak RSS is ``ru_maxrss`` of the process (from its exec: imports, loading and the explanation);
RSS after loading is ``VmRSS`` once the model is loaded (rulegraph: and its plan prepared). Memory
is not time: it holds on a busy machine, so no timings are reported.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import REPO, last_json, machine, peak_rss, report

#: model name → (transformers config class, LM class, config keywords)
MODELS = {
    "gpt2-small": ("GPT2Config", "GPT2LMHeadModel",
                   dict(vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=2048,
                        bos_token_id=None, eos_token_id=None)),
    "llama-100m": ("LlamaConfig", "LlamaForCausalLM",
                   dict(vocab_size=32000, hidden_size=768, num_hidden_layers=8, intermediate_size=2048,
                        num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048,
                        tie_word_embeddings=False, pad_token_id=0, bos_token_id=None, eos_token_id=None)),
    "tiny": ("LlamaConfig", "LlamaForCausalLM",
             dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  tie_word_embeddings=False, pad_token_id=0, bos_token_id=None, eos_token_id=None)),
}

#: variant → (label, interpreter: "repo" or "lxt")
VARIANTS = {
    "rulegraph": ("rulegraph attnlrp (audit on)", "repo"),
    "rulegraph-no-audit": ("rulegraph attnlrp (audit off)", "repo"),
    "gi": ("torch autograd Gradient×Input (HF, no weight gradients)", "repo"),
    "lxt": ("LXT AttnLRP (efficient, HF)", "lxt"),
}


# -- the measured processes ------------------------------------------------------------------------------------

def rss_gib() -> float:
    """This process's resident memory now (``VmRSS``), GiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def ids(length: int, vocab: int):
    import torch
    g = torch.Generator().manual_seed(length)
    tokens = torch.randint(5, min(vocab, 30_000), (1, length), generator=g)
    return {"input_ids": tokens, "attention_mask": torch.ones_like(tokens)}


def make(work: Path, name: str) -> dict:
    """Save the random-weight model and export it (once)."""
    import torch
    import transformers
    sys.path.insert(0, str(REPO / "tests"))
    import tiny
    from rulegraph.exporters import export_hf
    folder = work / name
    config_class, model_class, keywords = MODELS[name]
    if not (folder / "hf" / "config.json").exists():
        torch.manual_seed(0)
        config = getattr(transformers, config_class)(attn_implementation="eager", **keywords)
        model = getattr(transformers, model_class)(config).eval()
        model.save_pretrained(folder / "hf")
        tiny.lm_tokenizer().save(str(folder / "hf" / "tokenizer.json"))
    if not (folder / "export" / "model.onnx").exists():
        export_hf(folder / "hf", folder / "export", overwrite=True)
    model = getattr(transformers, model_class).from_pretrained(folder / "hf")
    return {"parameters": sum(p.numel() for p in model.parameters())}


def child(variant: str, folder: str, length: str) -> None:
    """One measurement: prints a JSON line with the RSS after loading."""
    import torch
    torch.set_num_threads(1)
    folder_path, length_n = Path(folder), int(length)
    if variant.startswith("rulegraph"):
        import rulegraph
        graph = rulegraph.load(folder_path / "export" / "model.onnx")
        rulegraph.prepare(graph)
        loaded = rss_gib()
        vocab = int(graph.constants[max(graph.constants, key=lambda k: graph.constants[k].numel())].shape[0])
        e = rulegraph.explain(graph, "attnlrp", ids(length_n, vocab), audit=variant == "rulegraph")
        print(json.dumps({"loaded_gib": loaded, "target": e.target[0]}))
        return
    import transformers
    if variant == "lxt":
        from lxt.efficient import monkey_patch
        config = transformers.AutoConfig.from_pretrained(folder_path / "hf")
        monkey_patch(__import__(f"transformers.models.{config.model_type}.modeling_{config.model_type}",
                                fromlist=["_"]), verbose=False)
    sys.path.insert(0, str(REPO / "benchmarks"))
    from harness import gradient_times_input
    model = transformers.AutoModelForCausalLM.from_pretrained(folder_path / "hf", attn_implementation="eager",
                                                              dtype=torch.float32).eval()
    loaded = rss_gib()
    feeds = ids(length_n, model.config.vocab_size)
    explain = gradient_times_input(
        model, lambda: model.get_input_embeddings()(feeds["input_ids"]),
        lambda w: model(inputs_embeds=w, attention_mask=feeds["attention_mask"], use_cache=False).logits,
        lambda logits: logits[0, -1].max())
    explain()
    print(json.dumps({"loaded_gib": loaded}))


CHILD = "import sys; sys.path.insert(0, {bench!r}); import memory; memory.child(*sys.argv[1:])"


def made(work: Path, name: str) -> dict:
    """:func:`make` in a process of its own (its imports stay out of the measuring process)."""
    run = subprocess.run([sys.executable, __file__, "--make", str(work), name], capture_output=True, text=True,
                         check=True)
    return json.loads(run.stdout.splitlines()[-1])


# -- the driver --------------------------------------------------------------------------------------------------

def measure(variant: str, folder: Path, length: int, python: str) -> dict:
    out = peak_rss(CHILD.format(bench=str(REPO / "benchmarks")), variant, str(folder), str(length), python=python)
    return {**last_json(out["stdout"]), "peak_gib": out["peak_gib"]}


def lxt_arguments(ap: argparse.ArgumentParser, out: str, reads: str = "lxt and rulegraph import") -> None:
    """The options of a benchmark that runs :data:`MODELS` here and LXT in another interpreter: ``--models``,
    ``--lxt-python``, ``--work`` (the models, made once) and ``--out`` (``benchmarks/results/OUT``)."""
    ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["gpt2-small", "llama-100m"])
    ap.add_argument("--lxt-python", default=os.environ.get("LXT_PYTHON", ""),
                    help=f"an interpreter where {reads} (LXT 2.1 needs transformers 4.x)")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "rulegraph-memory")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / out)


def lxt_importable(python: str | None) -> str | None:
    """The LXT interpreter's versions line, or ``None`` when it cannot import ``lxt.efficient``."""
    if not python:
        return None
    probe = ("import lxt.efficient, transformers, torch, importlib.metadata as m; "
             "print('LXT', m.version('lxt'), '· transformers', transformers.__version__, '· torch', torch.__version__)")
    run = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    return run.stdout.strip() if run.returncode == 0 else None


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--make":
        print(json.dumps(make(Path(sys.argv[2]), sys.argv[3])))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048])
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    lxt_arguments(ap, "memory.md", reads="lxt imports")
    args = ap.parse_args()
    lxt = lxt_importable(args.lxt_python)
    variants = [v for v in args.variants if v != "lxt" or lxt]
    rows, sizes = [], []
    for name in args.models:
        sizes.append(f"{name}: {made(args.work, name)['parameters'] / 1e6:,.1f} M parameters")
        for length in args.lengths:
            found = {}
            for variant in variants:
                python = args.lxt_python if VARIANTS[variant][1] == "lxt" else sys.executable
                found[variant] = measure(variant, args.work / name, length, python)
                print(name, length, variant, found[variant], flush=True)
            reference = found.get("lxt")
            for variant, r in found.items():
                ratio = f"{r['peak_gib'] / reference['peak_gib']:.2f}×" if reference else ""
                rows.append([name, length, VARIANTS[variant][0], f"{r['loaded_gib']:.2f}", f"{r['peak_gib']:.2f}",
                             ratio])
    conditions = [
        f"{machine(1)} · float32, batch 1, CPU, one torch thread per process.",
        "",
        "Models (random weights from transformers configs, exported by rulegraph's exporter): " + "; ".join(sizes) + ".",
        "",
        "Each row is one process: RSS after loading (rulegraph: the ONNX file loaded and its plan prepared; HF: "
        "`from_pretrained`) and its peak RSS (`ru_maxrss`, imports included), explaining the next token after L "
        "random ids. " + (f"LXT: {lxt}, run by another interpreter with the same torch." if lxt else
                          "LXT was not importable here (`--lxt-python`): its rows are missing."),
        "",
        f"`python benchmarks/memory.py --models {' '.join(args.models)} --lengths "
        f"{' '.join(map(str, args.lengths))}`",
    ]
    report(args.out, "Peak memory of an explanation: rulegraph, LXT, autograd Gradient×Input", conditions,
           ["model", "tokens", "method", "RSS after loading GiB", "peak RSS GiB", "peak vs LXT"], rows)


if __name__ == "__main__":
    main()
