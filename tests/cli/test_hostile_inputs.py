"""Hostile and unlucky input on the command line, by class: each case is refused with one line
``error: …`` (exit 2; ``check`` exits 1), no traceback, every file and link of the user's folder
unchanged, under a memory cap (RLIMIT_AS of the process running the cases) and a time limit.

The cases run in one child process (``tests/run_bounded.py``: torch is imported once) with a 4 GiB
address-space cap and 60 s per case; the user's folder is built by :func:`hostile.build`. In argv,
``{name}`` is a path from there and ``{out}`` a fresh output folder outside it."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hostile

MEMORY = 4 * 2**30
SECONDS = 60
E = ["explain"]
T = ["-t", "w1 w2 w3"]
GRPC = importlib.util.find_spec("grpc") is not None
RAY = importlib.util.find_spec("ray") is not None

#: (id, argv, the message's words, exit code)
CASES = [
    # 1. a model file runs code, or expands without bound: refused before torch reads it
    ("pt2-pickled-weight-check", ["check", "{pt2-pickled-weight}", "-r", "gi"],
     "weight 'l.weight' (ok/data/weights/model_weights_config.json) is pickled (use_pickle); rulegraph never "
     "unpickles a model file", 2),
    ("pt2-pickled-weight-explain", [*E, "{pt2-pickled-weight}", "-r", "gi", "-i", "x=1,2,3"], "is pickled (use_pickle)", 2),
    ("pt2-pickled-inputs", ["check", "{pt2-pickled-inputs}", "-r", "gi"],
     "holds an object that only a full unpickling could load (e.g. its sample inputs)", 2),
    ("pt2-opaque-object", ["check", "{pt2-opaque}", "-r", "gi"], "constant 'c'", 2),
    ("pt2-compiled-code", ["check", "{pt2-aoti}", "-r", "gi"], "holds AOTInductor compiled code", 2),
    ("pt2-zip-bomb", ["check", "{pt2-bomb}", "-r", "gi"],
     "ok/extra/padding expands 1,029 times (65,232 → 67,108,864 bytes); a member may expand at most 100 times", 2),
    # 2. user files are never overwritten or deleted
    ("json-link", [*E, "{bert}", "-r", "gi", *T, "--json", "{dir}/link.json", "--force"],
     "link.json is a symbolic link; rulegraph never writes through a link", 2),
    ("html-link", [*E, "{bert}", "-r", "gi", *T, "--html", "{dir}/link.json", "--force"], "is a symbolic link", 2),
    ("json-is-the-model", [*E, "{bert}", "-r", "gi", *T, "--json", "{bert}", "--force"],
     "model.onnx is a file this run reads; write the output elsewhere (--force never replaces an input)", 2),
    ("json-is-the-tokenizer", [*E, "{bert}", "-r", "gi", *T, "--json", "{dir}/bert/tokenizer.json", "--force"],
     "tokenizer.json is a file this run reads", 2),
    ("heads-out-link", ["heads", "calibrate", "{bert}", "--data", "{dir}/ok.csv", "--out", "{dir}/link.yaml",
                        "--force", "--no-syntax"], "link.yaml is a symbolic link", 2),
    ("heads-out-is-data", ["heads", "calibrate", "{bert}", "--data", "{dir}/ok.csv", "--out", "{dir}/ok.csv",
                           "--force", "--no-syntax"], "ok.csv is a file this run reads", 2),
    ("heads-png-suffix", ["heads", "calibrate", "{bert}", "--data", "{dir}/ok.csv", "--out", "{out}/m.yaml",
                          "--png", "{dir}/heads", "--no-syntax"], "heads.png exists; pass --force to overwrite it", 2),
    ("generate-png-suffix", [*E, "{lm}", "-r", "gi", "-t", "w1 w2", "--generate", "2", "--png", "{dir}/plot"],
     "--png {dir}/plot.png exists; pass --force to overwrite it", 2),
    *[(f"dataset-{name.split('.')[0]}-link", ["explain-dataset", "{bow}", "-m", "gi", "--data", "{dir}/ok.csv",
                                              "--out", f"{{links-dataset-{name}}}", "--force", "-q"],
       f"{name} is a symbolic link; rulegraph never writes through a link", 2)
      for name in ("summary.json", "rows.jsonl", "config.json", "explanations.parquet")],
    *[(f"evaluate-{name.split('.')[0]}-link", ["evaluate", "{bow}", "--methods", "random", "--data", "{dir}/ok.csv",
                                               "--out", f"{{links-evaluate-{name}}}", "--force", "-q"],
       f"{name} is a symbolic link", 2) for name in ("results.jsonl", "table.csv")],
    ("dataset-data-is-journal", ["explain-dataset", "{bow}", "-m", "gi", "--data", "{dir}/data-in-out/rows.jsonl",
                                 "--out", "{dir}/data-in-out", "--force", "-q"],
     "rows.jsonl is a file this run reads; write the output elsewhere (--force never replaces an input)", 2),
    ("evaluate-data-is-journal", ["evaluate", "{bow}", "--methods", "random", "--data",
                                  "{dir}/data-in-out/results.jsonl", "--out", "{dir}/data-in-out", "--force", "-q"],
     "results.jsonl is a file this run reads", 2),
    ("dataset-out-is-a-model-folder", ["explain-dataset", "{bow}", "-m", "gi", "--data", "{dir}/ok.csv", "--out",
                                       "{hf}", "--force", "-q"],
     "config.json is not the settings file of a rulegraph run (another program's config.json, e.g. a model's); "
     "choose another --out (--force never replaces it)", 2),
    ("export-link", ["export", "{hf}", "{dir}/export-link", "--force"], "model.onnx is a symbolic link", 2),
    # 4. silent wrong targets and dropped options
    ("target-pad-classifier", [*E, "{bert}", "-r", "gi", *T, "--target", "[PAD]"],
     "target '[PAD]' is not a class of this model; its classes: negative, positive", 2),
    ("target-text-span-qa", [*E, "{qa}", "-r", "gi", *T, "--output", "end_logits", "--target", "w5"],
     "target 'w5' is text, but output 'end_logits' is not indexed by the vocabulary (it scores positions); give a "
     "position index", 2),
    ("contrast-text-classifier", [*E, "{bert}", "-r", "gi", *T, "--target", "1", "--contrast", "w5"],
     "contrast 'w5' is not a class of this model; its classes: negative, positive", 2),
    ("objective-text-classifier", [*E, "{bert}", "-r", "gi", *T, "--objective", "logit['w5']"],
     "objective token 'w5' is text, but output 'logits' is not indexed by the vocabulary (it scores 2 classes)", 2),
    ("question-twice", [*E, "{qa}", "-r", "gi", *T, "--question", "who", "--question", "what"],
     "--question takes one value and was given more than once", 2),
    ("rules-twice", [*E, "{bert}", "-r", "gi", "-r", "lrp-ah", *T], "--rules/-r takes one value", 2),
    ("heads-n-twice", ["heads", "calibrate", "{bert}", "--data", "{dir}/ok.csv", "--n", "2", "--n", "3"],
     "--n takes one value", 2),
    ("bool-ids", [*E, "{bert}", "-r", "gi", "-i", "input_ids={dir}/bool.npy"], "input input_ids must be int64, got bool", 2),
    *[(f"csv-{name}", ["evaluate", "{bow}", "--methods", "random", "--data", f"{{dir}}/{name}.csv", "--out", "{out}"],
       message, 2) for name, message in (
        ("unterminated", "unterminated.csv:2: a quoted field opened in the record starting on line 2 is never closed"),
        ("merged", "merged.csv:2: a quoted field runs over lines 2…3 (an unterminated quote?)"),
        ("ragged", "ragged.csv:2: the record has 3 fields, the header 2 (text, label)"),
        ("short", "short.csv:3: the record has 1 fields, the header 2"),
        ("twice", "twice.csv:1: column 'text' appears twice in the header"),
        ("after-quote", "after-quote.csv:2: not a valid CSV file"))],
    *[(f"label-{name}", ["explain-dataset", "{bow}", "-m", "gi", "--data", f"{{dir}}/{name}.jsonl", "--out", "{out}"],
       message, 2) for name, message in (
        ("bool", "bool.jsonl:1: row 1: label true is a boolean, not a class"),
        ("fraction", "fraction.jsonl:1: row 1: label 1.5 is not a class index"),
        ("float-id", "float-id.jsonl:1: row 1: label 1.0 is a decimal number; write the class index 1"),
        ("huge-label", "huge-label.jsonl:1: row 1: label 10000000… is outside the model's 2 classes"))],
    ("xi-pos-nan", ["heads", "calibrate", "{bert}", "--data", "{dir}/ok.csv", "--xi-pos", "nan"],
     "--xi-pos must be a finite number in 0…1, got nan", 2),
    ("xi-pos-7", ["heads", "calibrate", "{bert}", "--data", "{dir}/ok.csv", "--xi-pos", "7"],
     "--xi-pos must be a number in 0…1 (got 7.0)", 2),
    ("xi-synt-negative", ["heads", "calibrate", "{bert}", "--data", "{dir}/ok.csv", "--xi-synt", "-3"],
     "--xi-synt must be a number in 0…1 (got -3.0)", 2),
    ("metric-no-row-scores", ["evaluate", "{bow}", "--methods", "random", "--data", "{dir}/ok.csv", "--metrics",
                              "precision@k", "--out", "{out}"],
     "metric 'precision@k' scores span-QA answers: no record of {dir}/ok.csv has an `answer`", 2),
    ("opset-unknown", [*E, "{opset99}", "-r", "gi", "-i", "x=1,2,3"],
     "opset 99 of the default ONNX domain is not one rulegraph knows (1…23)", 2),
    # 5. unbounded work
    ("generate-unbounded", [*E, "{lm}", "-r", "gi", "-t", "w1 w2", "--generate", "100000"],
     "the prompt has 2 tokens and 100000 generated tokens need 100001 positions; the model takes at most 8192 "
     "(rulegraph's limit for a model that states none", 2),
    ("expand-explain", [*E, "{expand}", "-r", "gi", "-i", "x=1,2,3"],
     "node 'expand' (Expand) would make a tensor of 30,000,000,000 elements (111.8 GiB); the limit for one tensor is "
     "8.0 GiB", 2),
    ("expand-check", ["check", "{expand}", "-r", "gi"], "the forward fails on a made-up input of x 1×3: node 'expand' (Expand) would make", 1),
    ("groups-huge-range", [*E, "{bert}", "-r", "decomposition", *T, "--groups", "0-300000000"],
     "--groups '0-300000000': position 300000000 is outside the input's 5 positions (0…4)", 2),
    # 6. what was an internal error (exit 3)
    ("metadata-labels", [*E, "{labels-json}", "-r", "gi", *T],
     "the export's metadata rulegraph.labels must be a JSON list of at most 1,048,576 distinct class names", 2),
    ("metadata-labels-twice", ["check", "{labels-twice}", "-r", "gi"], "rulegraph.labels must be a JSON list", 2),
    ("metadata-length-zero", [*E, "{length-zero}", "-r", "gi", *T],
     "the export's metadata rulegraph.max_length must be an integer in 1…16,777,216", 2),
    ("metadata-length-text", ["evaluate", "{length-text}", "--methods", "random", "--data", "{dir}/ok.csv",
                              "--out", "{out}"], "rulegraph.max_length must be an integer", 2),
    ("config-cut-short", ["explain-dataset", "{bow}", "-m", "gi", "--data", "{dir}/ok.csv", "--out",
                          "{dir}/cut-config"], "config.json is not valid JSON (cut short by a stop?); pass --force", 2),
    ("heads-out-folder", ["heads", "calibrate", "{bert}", "--data", "{dir}/ok.csv", "--out", "{dir}", "--force"],
     "--out {dir} is a directory; give a file name inside it", 2),
    # 7. misleading errors
    ("objective-overflow", [*E, "{bert}", "-r", "gi", *T, "--objective", "1e999*logit[1]"],
     "coefficient 1e999 at column 1 is not a finite number; coefficients are at most 1e+06 in magnitude", 2),
    ("heads-n-zero", ["heads", "calibrate", "{bert}", "--data", "{dir}/ok.csv", "--n", "0"],
     "--n must be an integer ≥ 1 (got 0)", 2),
    ("text-too-long", [*E, "{bert}", "-r", "gi", "-t", "w1 " * 40_000],
     "the text has 120,000 characters; rulegraph reads at most 100,000", 2),
]
if RAY:
    CASES += [
        ("ray-workers-beyond-cpus", ["explain-dataset", "{bow}", "-m", "gi", "--data", "{dir}/ok.csv", "--out", "{out}",
                                     "--engine", "ray", "--num-workers", "4096"],
         "--num-workers 4096 × --cpus-per-worker 1 = 4096 CPUs, and this machine has", 2),
        ("ray-address-garbage", ["evaluate", "{bow}", "--methods", "random", "--data", "{dir}/ok.csv", "--out", "{out}",
                                 "--engine", "ray", "--address", "not an address"],
         "--address 'not an address' is not a Ray address; valid: auto, HOST:PORT, ray://HOST:PORT", 2),
        ("ray-address-unreachable", ["explain-dataset", "{bow}", "-m", "gi", "--data", "{dir}/ok.csv", "--out", "{out}",
                                     "--engine", "ray", "--address", "127.0.0.1:1"],
         "--address 127.0.0.1:1: no Ray cluster answers at 127.0.0.1:1", 2),
    ]
    if not GRPC:
        CASES.append(("ray-client-without-extra", ["evaluate", "{bow}", "--methods", "random", "--data", "{dir}/ok.csv",
                                                   "--out", "{out}", "--engine", "ray", "--address", "ray://127.0.0.1:1"],
                      "Ray's client (ray://) needs its extra: pip install 'ray[client]'", 2))


@pytest.fixture(scope="module")
def results(tmp_path_factory, bert_onnx):
    """Every case, run once in a child process under the memory cap and the time limit."""
    root = tmp_path_factory.mktemp("hostile")
    names = hostile.build(root / "user", bert_onnx)
    cases = [{"id": case, "argv": [_fill(a, names, root / "out" / case) for a in argv]} for case, argv, _, _ in CASES]
    spec = root / "cases.json"
    spec.write_text(json.dumps({"folder": names["dir"], "cases": cases}))
    done = root / "results.json"
    run = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "run_bounded.py"), str(spec), str(done),
                          str(MEMORY), str(SECONDS)], capture_output=True, text=True, timeout=SECONDS * len(CASES),
                         env={**os.environ, "RULEGRAPH_DEBUG": ""})
    found = json.loads(done.read_text()) if done.exists() else {}
    assert run.returncode == 0 and len(found) == len(CASES), run.stderr[-3000:]
    return found, names


def _fill(arg: str, names: dict[str, str], out: Path) -> str:
    for key, value in {**names, "out": str(out)}.items():
        arg = arg.replace("{" + key + "}", value)
    return arg


def test_the_corpus_covers_every_class():
    assert len(CASES) >= 60
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("argv, message, code", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_input_is_refused_in_one_line_within_bounds(results, argv, message, code, request):
    found, names = results
    case = found[request.node.callspec.id]
    output = case["output"]
    assert case["code"] == code, output[-2000:]
    assert "Traceback" not in output and "internal error" not in output
    message = _fill(message, names, Path())
    if code == 2:                                # one line: error: …
        errors = [line for line in output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and message in " ".join(errors[0].split()), output[-2000:]
    assert message in " ".join(output.split()), output[-2000:]
    assert case["changed"] == []                 # the user's files and links as they were
    assert case["seconds"] < SECONDS
    assert not (Path(names["dir"]) / hostile.MARKER).exists()      # no pickled payload ran
