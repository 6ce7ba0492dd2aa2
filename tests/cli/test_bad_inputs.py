"""A corpus of bad inputs, on the command line: each is refused before any work with one line
``error: …`` naming the problem, exit code 2, no traceback, and every file the user gave intact.

Cases are ``(id, argv, message)``; in argv, ``{model}`` is the tiny BERT export (with its
tokenizer.json beside it), ``{dir}`` a scratch folder holding the user's files, which are
hashed before and after the run.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from rulegraph.cli import main

RULES = "rules:\n  - op: '*'\n    rule: gradient\n"


def _files(folder: Path) -> None:
    """The user's files the cases refer to."""
    (folder / "ok.yaml").write_text(RULES)
    (folder / "existing.json").write_text('{"keep": true}')
    (folder / "existing.html").write_text("<p>keep</p>")
    (folder / "latin1.yaml").write_bytes("rules:\n  - op: Add  # café\n".encode("latin-1") + b"\xff\n")
    (folder / "empty.yaml").write_text("")
    (folder / "dir.yaml").mkdir()
    (folder / "readonly").mkdir()
    (folder / "not-onnx.onnx").write_text("hello")
    (folder / "truncated.pt2").write_bytes(os.urandom(256))
    (folder / "hf").mkdir()
    (folder / "hf" / "config.json").write_text('{"model_type": "bert"}')
    (folder / "two").mkdir()
    (folder / "two" / "a.onnx").write_text("x")
    (folder / "two" / "b.onnx").write_text("x")
    (folder / "not-json.json").write_text("{")
    np.save(folder / "ids.npy", np.array([[2, 7, 3]]))
    np.save(folder / "objects.npy", np.array([[{"a": 1}]], dtype=object), allow_pickle=True)
    (folder / "bad.npy").write_bytes(b"\x93NUMPY garbage")
    np.save(folder / "floats.npy", np.array([[0.5, 1.5]], dtype=np.float32))
    n = helper.make_node("Relu", ["x"], ["y"])
    g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])], [])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), folder / "no-outputs.onnx")
    n = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")
    g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)]),
              folder / "custom-op.onnx")
    (folder / "ok.csv").write_text("text,label\nw1 w2 w3,1\nw4 w5,0\n")
    (folder / "latin1.csv").write_bytes("text,label\nw1 w2,1\nw3 café,0\n".encode("latin-1"))
    (folder / "no-text.csv").write_text("sentence,label\nw1 w2,1\n")
    (folder / "empty.csv").write_text("")
    (folder / "data.csv").mkdir()
    (folder / "label-range.csv").write_text("text,label\nw1 w2,1\nw3 w4,5\n")
    (folder / "label-negative.csv").write_text("text,label\nw1 w2,-1\n")
    (folder / "label-name.csv").write_text("text,label\nw1 w2,great\n")
    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    bomb += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    (folder / "bomb.yaml").write_text("\n".join(bomb) + "\nrules:\n  - op: Add\n    rule: route\n    note: *a8\n")


def _rule(params: str, rule: str = "epsilon", op: str = "Gemm") -> str:
    return f"rules:\n  - op: {op}\n    rule: {rule}\n    params: {params}\n  - op: '*'\n    rule: gradient\n"


#: rule files written for one case each: name → text
RULE_FILES = {
    "neg-eps.yaml": _rule("{epsilon: -0.1}"),
    "neg-gamma.yaml": _rule("{gamma: -0.5}", "gamma", "Conv"),
    "neg-stab.yaml": _rule("{stabilizer: -1.0e-6}", "zplus", "Conv"),
    "ab.yaml": _rule("{alpha: 3, beta: 1}", "alphabeta", "Conv"),
    "ab-neg.yaml": _rule("{alpha: -1, beta: -2}", "alphabeta", "Conv"),
    "detach.yaml": _rule("{detach: [4]}", "gradient", "Add"),
    "detach-neg.yaml": _rule("{detach: [-1]}", "gradient", "Add"),
    "probs.yaml": _rule("{probs: 9}", "ah", "MatMul"),
    "lambda.yaml": "pass: decomposition\n" + _rule("{threshold: 1.5}", "activation", "Relu").replace(
        "rule: gradient", "rule: linear"),
    "variant.yaml": "pass: decomposition\n" + _rule("{variant: tilde}", "activation", "Relu").replace(
        "rule: gradient", "rule: linear"),
    "tag.yaml": "rules:\n  - op: Add\n    rule: epsilon\n    params: {epsilon: !!python/object:os.system x}\n",
    "unknown-rule.yaml": "rules:\n  - op: Add\n    rule: epsilom\n",
    "unknown-key.yaml": "rules:\n  - op: Add\n    rule: route\n    param: {}\n",
    "unknown-param.yaml": _rule("{epsilonn: 0.1}"),
    "param-type.yaml": _rule("{epsilon: lots}"),
    "trait.yaml": "rules:\n  - trait: routeing\n    rule: route\n",
    "pass.yaml": "pass: backward\nrules:\n  - op: Add\n    rule: route\n",
    "canonize.yaml": "canonize: [batchnorms]\nrules:\n  - op: Add\n    rule: route\n",
    "boundary.yaml": "boundary: embedding\nrules:\n  - op: Add\n    rule: route\n",
    "unmatched.yaml": "on_unmatched: ignore\nrules:\n  - op: Add\n    rule: route\n",
    "invalid.yaml": "rules: [\n  - op: X\n",
    "nolist.yaml": "rules: {op: Add}\n",
    "per-layer.yaml": "rules:\n  - op: Gemm\n    rule: epsilon\n    per_layer:\n      - {params: {epsilon: 1}}\n"
                      "  - op: '*'\n    rule: gradient\n",
    "blocks.yaml": "rules:\n  - op: Gemm\n    rule: epsilon\n    per_layer:\n      - {blocks: '3-1', params: {epsilon: 1}}\n"
                   "  - op: '*'\n    rule: gradient\n",
    "bad-pattern.yaml": "rules:\n  - op: MatMul\n    inputs:\n      0: {form: Softmax}\n    rule: ah\n",
    "wrong-op.yaml": "rules:\n  - op: MatMul\n    rule: ln\n  - op: '*'\n    rule: gradient\n",
    "no-rule.yaml": "rules:\n  - op: Add\n",
    "boundary-nodes.yaml": "boundary: {nodes: ['nothing*']}\nrules:\n  - op: '*'\n    rule: gradient\n",
}

E = ["explain", "{model}"]
#: evaluate, its results in {out} (a folder beside {dir}: only the files the user gave are hashed)
V = ["evaluate", "{model}", "--methods", "random", "--out", "{out}"]
OK = ["--data", "{dir}/ok.csv"]
#: explain-dataset, its rows in {out}
D = ["explain-dataset", "{model}", "--out", "{out}"]
T = ["-t", "w1 w2 w3"]
CASES = [
    # the model file
    ("model-missing", ["explain", "{dir}/none.onnx", "-r", "gi", *T], "model file not found"),
    ("model-not-onnx", ["explain", "{dir}/not-onnx.onnx", "-r", "gi", *T], "is not a readable ONNX model"),
    ("model-dir-two", ["explain", "{dir}/two", "-r", "gi", *T], "is a directory with 2 .onnx files"),
    ("model-dir-none", ["explain", "{dir}/readonly", "-r", "gi", *T], "is a directory with 0 .onnx files"),
    ("model-pt2-truncated", ["explain", "{dir}/truncated.pt2", "-r", "gi", *T], "not a readable torch.export program"),
    ("model-no-outputs", ["explain", "{dir}/no-outputs.onnx", "-r", "gi", "-i", "x=1,2,3"], "has no outputs"),
    ("model-custom-op", ["explain", "{dir}/custom-op.onnx", "-r", "gi", "-i", "x=1,2,3"],
     "rulegraph implements no op of domain 'com.example'"),
    ("check-no-outputs", ["check", "{dir}/no-outputs.onnx", "-r", "gi"], "has no outputs"),
    ("audit-model-missing", ["audit", "{dir}/none.onnx", "-r", "gi", *T], "model file not found"),
    # rule files
    ("rules-unknown-name", [*E, "-r", "lrp-ahh", *T], "no rule set named 'lrp-ahh'; did you mean"),
    ("rules-missing-file", [*E, "-r", "{dir}/none.yaml", *T], "rule file not found"),
    ("rules-directory", [*E, "-r", "{dir}/dir.yaml", *T], "is a directory, not a rule file"),
    ("rules-latin1", [*E, "-r", "{dir}/latin1.yaml", *T], "latin1.yaml:2: the rule file is not UTF-8"),
    ("rules-empty", [*E, "-r", "{dir}/empty.yaml", *T], "the rule file is empty"),
    ("rules-bomb", [*E, "-r", "{dir}/bomb.yaml", *T], "expands to more than 100,000 YAML nodes"),
    ("rules-bomb-check", ["check", "{model}", "-r", "{dir}/bomb.yaml"], "expands to more than 100,000 YAML nodes"),
    ("rules-neg-eps", [*E, "-r", "{dir}/neg-eps.yaml", *T], "neg-eps.yaml:4: param 'epsilon' of rule 'epsilon' must be ≥ 0"),
    ("rules-neg-gamma", [*E, "-r", "{dir}/neg-gamma.yaml", *T], "param 'gamma' of rule 'gamma' must be ≥ 0"),
    ("rules-neg-stab", [*E, "-r", "{dir}/neg-stab.yaml", *T], "param 'stabilizer' of rule 'zplus' must be ≥ 0"),
    ("rules-alphabeta", [*E, "-r", "{dir}/ab.yaml", *T], "alpha − beta must be 1"),
    ("rules-alphabeta-neg", [*E, "-r", "{dir}/ab-neg.yaml", *T], "param 'alpha' of rule 'alphabeta' must be ≥ 0"),
    ("rules-detach", [*E, "-r", "{dir}/detach.yaml", *T], "detach lists input 4, but the node has 2 inputs"),
    ("rules-detach-neg", [*E, "-r", "{dir}/detach-neg.yaml", *T], "param 'detach' of rule 'gradient' must be ≥ 0"),
    ("rules-probs", [*E, "-r", "{dir}/probs.yaml", *T], "probs=9 but the node has 2 inputs"),
    ("rules-lambda", [*E, "-r", "{dir}/lambda.yaml", *T], "param 'threshold' of rule 'activation' must be ≤ 1"),
    ("rules-variant", [*E, "-r", "{dir}/variant.yaml", *T], "variant must be one of hat, bar"),
    ("rules-unsafe-tag", [*E, "-r", "{dir}/tag.yaml", *T], "tag.yaml:4: tag 'tag:yaml.org,2002:python/object"),
    ("rules-unknown-rule", [*E, "-r", "{dir}/unknown-rule.yaml", *T], "unknown rule 'epsilom'; did you mean 'epsilon'"),
    ("rules-unknown-key", [*E, "-r", "{dir}/unknown-key.yaml", *T], "unknown key 'param' in a rule entry"),
    ("rules-unknown-param", [*E, "-r", "{dir}/unknown-param.yaml", *T], "has no param 'epsilonn'"),
    ("rules-param-type", [*E, "-r", "{dir}/param-type.yaml", *T], "param 'epsilon' must be float, got 'lots'"),
    ("rules-trait", [*E, "-r", "{dir}/trait.yaml", *T], "unknown op trait 'routeing'; did you mean 'routing'"),
    ("rules-pass", [*E, "-r", "{dir}/pass.yaml", *T], "unknown pass 'backward'"),
    ("rules-canonizer", [*E, "-r", "{dir}/canonize.yaml", *T], "unknown canonizer 'batchnorms'"),
    ("rules-boundary", [*E, "-r", "{dir}/boundary.yaml", *T], "unknown boundary 'embedding'"),
    ("rules-on-unmatched", [*E, "-r", "{dir}/unmatched.yaml", *T], "on_unmatched must be error, warn or a rule name"),
    ("rules-invalid-yaml", [*E, "-r", "{dir}/invalid.yaml", *T], "not valid YAML"),
    ("rules-not-a-list", [*E, "-r", "{dir}/nolist.yaml", *T], "`rules:` must be a non-empty list"),
    ("rules-per-layer", [*E, "-r", "{dir}/per-layer.yaml", *T], "a per_layer item needs `blocks:`, `name:` or `scope:`"),
    ("rules-blocks", [*E, "-r", "{dir}/blocks.yaml", *T], "empty block range '3-1'"),
    ("rules-pattern", [*E, "-r", "{dir}/bad-pattern.yaml", *T], "unknown key 'form' in the pattern for input 0"),
    ("rules-wrong-op", [*E, "-r", "{dir}/wrong-op.yaml", *T], "rule 'ln' cannot apply to node"),
    ("rules-no-rule", [*E, "-r", "{dir}/no-rule.yaml", *T], "rule entry has no `rule:`"),
    ("rules-boundary-nodes", [*E, "-r", "{dir}/boundary-nodes.yaml", *T], "boundary nodes ['nothing*'] match no node"),
    ("rules-check-unknown", ["check", "{model}", "-r", "nope"], "no rule set named 'nope'"),
    ("rules-audit-neg-eps", ["audit", "{model}", "-r", "{dir}/neg-eps.yaml", *T], "must be ≥ 0"),
    # inputs
    ("text-empty", [*E, "-r", "gi", "-t", "   "], "the text is empty"),
    ("text-not-utf8", [*E, "-r", "gi", "-t", "w1 \udcff w2"], "--text is not valid UTF-8"),
    ("hf-folder", ["explain", "{dir}/hf", "-r", "gi", *T], "is a Hugging Face model folder, not an export: run "
                                                            "`rulegraph export"),
    ("hub-id", ["explain", "bert-base/uncased", "-r", "gi", *T], "a Hugging Face model name?"),
    ("text-no-tokenizer", ["explain", "{dir}/copy/model.onnx", "-r", "gi", *T], "no tokenizer.json next to"),
    ("tokenizer-missing", [*E, "-r", "gi", *T, "--tokenizer", "{dir}/none.json"], "tokenizer file not found"),
    ("tokenizer-bad", [*E, "-r", "gi", *T, "--tokenizer", "{dir}/not-json.json"], "is not a tokenizers tokenizer.json"),
    ("input-format", [*E, "-r", "gi", "-i", "input_ids"], "must look like NAME=1,2,3 or NAME=file.npy"),
    ("input-unknown-name", [*E, "-r", "gi", "-i", "ids=1,2"], "the model has no such input"),
    ("input-not-numbers", [*E, "-r", "gi", "-i", "input_ids=a,b"], "expected comma-separated integers"),
    ("input-empty", [*E, "-r", "gi", "-i", "input_ids="], "--input input_ids is empty"),
    ("input-negative-id", [*E, "-r", "gi", "-i", "input_ids=2,-5,3"], "holds the id -5; token ids are ≥ 0"),
    ("input-oov-id", [*E, "-r", "gi", "-i", "input_ids=2,500,3"], "holds the id 500, outside the vocabulary"),
    ("input-too-long", [*E, "-r", "gi", "-i", "input_ids=" + ",".join(["5"] * 70)], "the model takes at most 64"),
    ("input-mask-length", [*E, "-r", "gi", "-i", "input_ids=2,5,6,3", "-i", "attention_mask=1,1,1"],
     "input attention_mask has 3 along 'sequence'"),
    ("input-float-ids", [*E, "-r", "gi", "-i", "input_ids=2.5,3"], "expected comma-separated integers"),
    ("input-npy-missing", [*E, "-r", "gi", "-i", "input_ids={dir}/none.npy"], "file not found"),
    ("input-npy-bad", [*E, "-r", "gi", "-i", "input_ids={dir}/bad.npy"], "is not a readable .npy array"),
    ("input-npy-objects", [*E, "-r", "gi", "-i", "input_ids={dir}/objects.npy"], "is not a readable .npy array"),
    ("input-npy-floats", [*E, "-r", "gi", "-i", "input_ids={dir}/floats.npy"], "input input_ids must be int64"),
    ("input-none", [*E, "-r", "gi"], "give --text"),
    ("target-range", [*E, "-r", "gi", *T, "--target", "5"], "target 5 is out of range; the output has 2 classes"),
    ("target-negative", [*E, "-r", "gi", *T, "--target", "-1"], "target -1 is out of range"),
    ("position-classifier", [*E, "-r", "gi", *T, "--position", "2"], "has no positions"),
    ("target-text-pieces", [*E, "-r", "gi", *T, "--target", " w5 w6"],
     "target ' w5 w6' is not a class of this model; its classes: negative, positive"),
    ("target-text-unknown", [*E, "-r", "gi", *T, "--target", "zzz"], "target 'zzz' is not a class of this model"),
    ("target-text-no-tokens", [*E, "-r", "gi", *T, "--target", "  ?", "--tokenizer", "{dir}/ok.yaml"],
     "is not a tokenizers tokenizer.json"),
    ("target-empty", [*E, "-r", "gi", *T, "--target", " "], "--target is empty"),
    ("target-text-token-on-a-classifier", [*E, "-r", "gi", *T, "--target", "[PAD]"],
     "target '[PAD]' is not a class of this model; its classes: negative, positive"),
    ("contrast-text-pieces", [*E, "-r", "gi", *T, "--target", "0", "--contrast", "w1 w2"],
     "contrast 'w1 w2' is not a class of this model"),
    ("contrast-is-target", [*E, "-r", "gi", *T, "--target", "1", "--contrast", "1"], "contrast 1 is the target itself"),
    ("contrast-range", [*E, "-r", "gi", *T, "--contrast", "7"], "contrast 7 is out of range; the output has 2 classes"),
    ("contrast-baseline", [*E, "-m", "gs", *T, "--contrast", "0", "--target", "1"], "gs is a baseline"),
    ("score-unknown", [*E, "-r", "gi", *T, "--score", "prob"], "Invalid value for '--score'"),
    ("audit-contrast-is-target", ["audit", "{model}", "-r", "gi", *T, "--target", "0", "--contrast", "0"],
     "contrast 0 is the target itself"),
    ("output-unknown", [*E, "-r", "gi", *T, "--output", "logitz"], "no value named 'logitz' in the graph"),
    ("device-choice", [*E, "-r", "gi", *T, "--device", "tpu"], "Invalid value for '--device'"),
    ("dtype-choice", [*E, "-r", "gi", *T, "--dtype", "int8"], "Invalid value for '--dtype'"),
    ("audit-target-range", ["audit", "{model}", "-r", "gi", *T, "--target", "9"], "target 9 is out of range"),
    ("audit-input-oov", ["audit", "{model}", "-r", "gi", "-i", "input_ids=2,999"], "outside the vocabulary"),
    # output paths
    ("json-empty", [*E, "-r", "gi", *T, "--json", ""], "--json is an empty path"),
    ("json-directory", [*E, "-r", "gi", *T, "--json", "{dir}/readonly"], "is a directory"),
    ("json-exists", [*E, "-r", "gi", *T, "--json", "{dir}/existing.json"], "exists; pass --force"),
    ("html-exists", [*E, "-r", "gi", *T, "--html", "{dir}/existing.html"], "exists; pass --force"),
    ("json-device", [*E, "-r", "gi", *T, "--json", "/dev/full"], "is not a regular file"),
    ("html-readonly", [*E, "-r", "gi", *T, "--html", "{dir}/readonly/e.html"], "cannot write there"),
    ("json-html-one-file", [*E, "-r", "gi", *T, "--json", "{dir}/o.json", "--html", "{dir}/o.json"],
     "--json and --html both name"),
    # generation (the model here is a classifier)
    ("generate-zero", [*E, "-r", "gi", *T, "--generate", "0"], "--generate must be an integer ≥ 1 (got 0)"),
    ("generate-classifier", [*E, "-r", "gi", *T, "--generate", "2"],
     "generation needs a language model whose output 'logits' is [batch, positions, vocab]"),
    ("generate-and-continuation", [*E, "-r", "gi", *T, "--generate", "2", "--continuation", "w1"], "not both"),
    ("generate-target", [*E, "-r", "gi", *T, "--generate", "2", "--target", "1"], "--target does not apply"),
    ("generate-two-prompts", [*E, "-r", "gi", *T, *T, "--generate", "2"], "takes one prompt"),
    ("generate-png-exists", [*E, "-r", "gi", *T, "--generate", "2", "--png", "{dir}/existing.json"],
     "exists; pass --force"),
    ("generate-alpha-relevance", [*E, "-r", "gi", *T, "--generate", "2", "--alpha", "signed"],
     "--alpha applies to rule sets with `pass: decomposition` only"),
    ("batch-without-continuation", [*E, "-r", "gi", *T, "--batch", "4"], "--batch applies to --continuation"),
    ("generate-image", [*E, "-r", "gi", "--image", "{dir}/ok.yaml", "--generate", "2"], "--image or --audio for another model, and --question, do not apply"),
    ("audit-json-exists", ["audit", "{model}", "-r", "gi", *T, "--json", "{dir}/existing.json"], "exists; pass --force"),
    ("audit-json-directory", ["audit", "{model}", "-r", "gi", *T, "--json", "{dir}"], "is a directory"),
    # options
    ("rules-and-method", [*E, "-r", "gi", "-m", "ig", *T], "not both"),
    ("neither-rules-nor-method", [*E, *T], "give --rules NAME|PATH or --method NAME"),
    ("option-without-method", [*E, "-r", "gi", "-o", "steps=3", *T], "-o/--option sets options of a --method"),
    ("method-unknown", [*E, "-m", "igg", *T], "unknown method 'igg'"),
    ("method-option-unknown", [*E, "-m", "ig", "-o", "stepz=3", *T], "has no option 'stepz'"),
    ("method-option-type", [*E, "-m", "ig", "-o", "steps=many", *T], "must be int"),
    ("alpha-relevance", [*E, "-r", "gi", "--alpha", "signed", *T], "applies to rule sets with `pass: decomposition`"),
    ("groups-relevance", [*E, "-r", "lrp-ah-ln", "--groups", "word", *T], "applies to rule sets with `pass: decomposition`"),
    ("audit-top-negative", ["audit", "{model}", "-r", "gi", *T, "--top", "-1"], "Invalid value for '--top'"),
    ("image-with-text", [*E, "-r", "gi", "--image", "{dir}/ok.yaml", *T], "--image needs a model with a float"),
    ("export-opset", ["export", "{dir}", "{dir}/out", "--opset", "99"], "opset 99 is not supported"),
    ("export-opset-old", ["export", "{dir}", "{dir}/out", "--opset", "11"], "valid: 17…20"),
    ("export-source-missing", ["export", "{dir}/none", "{dir}/out"], "none"),
    ("export-out-is-file", ["export", "{dir}", "{dir}/existing.json"], "is a file; give a folder"),
    ("rules-cmd-unknown", ["rules", "lrp"], "no rule set named 'lrp'"),
    # evaluate: the data file
    ("eval-data-latin1", [*V, "--data", "{dir}/latin1.csv"], "latin1.csv:3: the data file is not UTF-8"),
    ("eval-data-no-text", [*V, "--data", "{dir}/no-text.csv"], "no `text` column (columns: sentence, label)"),
    ("eval-data-empty", [*V, "--data", "{dir}/empty.csv"], "empty.csv is empty"),
    ("eval-data-directory", [*V, "--data", "{dir}/data.csv"], "data.csv is a directory; give a CSV, JSON lines or Parquet file"),
    ("eval-data-missing", [*V, "--data", "{dir}/none.csv"], "data file not found"),
    ("eval-label-range", [*V, "--data", "{dir}/label-range.csv"],
     "label-range.csv:3: row 2: label 5 is outside the model's 2 classes; valid: 0…1"),
    ("eval-label-negative", [*V, "--data", "{dir}/label-negative.csv"], "label -1 is outside the model's 2 classes"),
    ("eval-label-name", [*V, "--data", "{dir}/label-name.csv"], "label 'great' is not a class label; valid: 0…1"),
    # evaluate: counts and ranges
    ("eval-batch-zero", [*V, *OK, "--batch", "0"], "--batch must be an integer in 1…65536 (got 0)"),
    ("eval-batch-negative", [*V, *OK, "--batch", "-4"], "--batch must be an integer in 1…65536 (got -4)"),
    ("eval-batch-text", [*V, *OK, "--batch", "many"], "--batch must be an integer in 1…65536, got 'many'"),
    ("eval-n-zero", [*V, *OK, "--n", "0"], "--n must be an integer ≥ 1 (got 0)"),
    ("eval-n-negative", [*V, *OK, "--n", "-3"], "--n must be an integer ≥ 1 (got -3)"),
    ("eval-batch-tokens", [*V, *OK, "--batch-tokens", "0"], "--batch-tokens must be an integer in 1…16777216"),
    ("eval-seed-negative", [*V, *OK, "--seed", "-1"], "--seed must be an integer in 0…4294967295 (got -1)"),
    ("eval-threads-zero", [*V, *OK, "--threads", "0"], "--threads must be an integer in 1…1024 (got 0)"),
    ("eval-aopc-k", [*V, *OK, "--aopc-k", "200"], "--aopc-k must be an integer in 0…100 (got 200)"),
    ("eval-aopc-step", [*V, *OK, "--aopc-step", "0"], "--aopc-step must be an integer in 1…100 (got 0)"),
    ("eval-steps", [*V, *OK, "--steps", "0"], "--steps must be an integer in 1…1000 (got 0)"),
    ("eval-words", [*V, *OK, "--words", "-2"], "--words must be an integer in 1…10000 (got -2)"),
    ("eval-lodds-k", [*V, *OK, "--lodds-k", "101"], "--lodds-k must be an integer in 0…100 (got 101)"),
    ("eval-removal", [*V, *OK, "--removal", "blank"], "Invalid value for '--removal'"),
    # evaluate: the protocol
    ("eval-protocol-unknown", [*V, *OK, "--protocol", "decomp"], "Invalid value for '--protocol'"),
    ("eval-aopc-grid-text", [*V, *OK, "--aopc-grid", "10,x"], "--aopc-grid must be comma-separated percentages"),
    ("eval-aopc-grid-range", [*V, *OK, "--aopc-grid", "10,150"], "--aopc-grid must list distinct percentages in 0…100"),
    ("eval-count-unknown", [*V, *OK, "--count", "nearest"], "Invalid value for '--count'"),
    ("eval-min-count", [*V, *OK, "--min-count", "-1"], "--min-count must be an integer ≥ 0 (got -1)"),
    ("eval-min-length-all", [*V, *OK, "--min-length", "99"], "every text has fewer than 99 tokens"),
    # evaluate: the output folder
    ("eval-out-file", ["evaluate", "{model}", *OK, "--methods", "random", "--out", "{dir}/existing.json"],
     "existing.json is a file, not a folder"),
    ("eval-out-under-file", ["evaluate", "{model}", *OK, "--methods", "random", "--out", "{dir}/existing.json/run"],
     "cannot create a folder there"),
    ("eval-out-readonly", ["evaluate", "{model}", *OK, "--methods", "random", "--out", "{dir}/readonly/run"],
     "cannot create there (permission denied"),
    # evaluate: methods
    ("eval-method-unknown", ["evaluate", "{model}", *OK, "--methods", "random,igg", "--out", "{out}"],
     "unknown method 'igg'"),
    ("eval-method-fails-everywhere", ["evaluate", "{model}", *OK, "--methods", "random,ig", "-o", "ig.steps=0",
                                      "--out", "{out}", "-q"], "method 'ig' failed on every text (2 of 2)"),
    # explain-dataset
    ("dataset-rules-and-method", [*D, *OK, "-r", "gi", "-m", "gi"], "give --rules NAME|PATH or --method NAME"),
    ("dataset-neither", [*D, *OK], "give --rules NAME|PATH or --method NAME (see `rulegraph methods`)"),
    ("dataset-option-of-rules", [*D, *OK, "-r", "gi", "-o", "steps=2"], "-o/--option sets options of a --method"),
    ("dataset-data-missing", [*D, "-m", "gi", "--data", "{dir}/none.csv"], "data file not found"),
    ("dataset-data-folder", [*D, "-m", "gi", "--data", "{dir}/data.csv"], "is a directory; give a CSV"),
    ("dataset-out-file", ["explain-dataset", "{model}", "-m", "gi", *OK, "--out", "{dir}/existing.json"],
     "existing.json is a file, not a folder"),
    # engines: Ray's options with the local engine, and GPUs on Ray workers (both commands)
    ("dataset-ray-option-local", [*D, "-m", "gi", *OK, "--num-workers", "3"],
     "--num-workers is an option of --engine ray"),
    ("dataset-gpus-on-cpu", [*D, "-m", "gi", *OK, "--engine", "ray", "--gpus-per-worker", "1"],
     "--gpus-per-worker 1 reserves GPUs that --device cpu leaves idle; add --device cuda"),
    ("dataset-cuda-without-gpus", [*D, "-m", "gi", *OK, "--engine", "ray", "--device", "cuda"],
     "--device cuda on Ray workers needs --gpus-per-worker"),
    ("eval-ray-option-local", [*V, *OK, "--address", "auto"], "--address is an option of --engine ray"),
    ("eval-gpus-on-cpu", [*V, *OK, "--engine", "ray", "--gpus-per-worker", "0.5"],
     "--gpus-per-worker 0.5 reserves GPUs that --device cpu leaves idle"),
    ("eval-cuda-without-gpus", [*V, *OK, "--engine", "ray", "--device", "cuda"],
     "--device cuda on Ray workers needs --gpus-per-worker"),
]


@pytest.fixture
def folder(tmp_path, bert_onnx):
    _files(tmp_path)
    for name, text in RULE_FILES.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "copy").mkdir()
    shutil.copy(bert_onnx, tmp_path / "copy" / "model.onnx")
    os.chmod(tmp_path / "readonly", 0o555)
    yield tmp_path
    os.chmod(tmp_path / "readonly", 0o755)


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_corpus_is_large_and_ids_are_unique():
    assert len(CASES) >= 90
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("argv, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_in_one_line(argv, message, folder, bert_onnx, capsys):
    if os.geteuid() == 0 and any("readonly/" in a for a in argv):
        pytest.skip("root writes into read-only folders")
    before = _digest(folder)
    out = folder.parent / f"{folder.name}-out"
    args = [a.replace("{model}", str(bert_onnx)).replace("{dir}", str(folder)).replace("{out}", str(out)) for a in argv]
    code = main(args)
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert code == 2, output
    assert "Traceback" not in output
    assert message in " ".join(output.split()), output
    assert _digest(folder) == before            # nothing the user gave was changed or removed
