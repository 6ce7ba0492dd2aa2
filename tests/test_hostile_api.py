"""Hostile and unlucky input through the Python API, by class: each call raises a
:class:`RulegraphError` subclass with a one-line message, leaves every file and link of the
user's folder as it was, and stays within a memory cap and a time limit (the calls run in one
child process, ``tests/run_bounded.py``, with a 4 GiB address-space cap and 60 s per call). Then
what must keep working around them: a plain ``.pt2`` loads, a fixed-batch model runs IG, a
malformed record is a failed row and the evaluation still draws its plots."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hostile
import rulegraph
import tiny
from rulegraph.errors import RulegraphError

MEMORY = 4 * 2**30
SECONDS = 60


# -- the calls (run in the child process: each gets the user's file names and a fresh output folder) --

def load_pickled_weight(n, out):
    rulegraph.load(n["pt2-pickled-weight"])


def load_pickled_inputs(n, out):
    rulegraph.load(n["pt2-pickled-inputs"])


def load_opaque(n, out):
    rulegraph.load(n["pt2-opaque"])


def load_compiled(n, out):
    rulegraph.load(n["pt2-aoti"])


def load_zip_bomb(n, out):
    rulegraph.load(n["pt2-bomb"])


def explain_expand(n, out):
    rulegraph.explain(n["expand"], "gi", {"x": torch.ones(1, 3)})


def load_bad_labels(n, out):
    rulegraph.load(n["labels-twice"])


def load_bad_length(n, out):
    rulegraph.load(n["length-text"])


def load_unknown_opset(n, out):
    rulegraph.load(n["opset99"])


def generate_unbounded(n, out):
    rulegraph.generate(n["lm"], "gi", text="w1 w2", max_new_tokens=100_000)


def groups_huge_range(n, out):
    rulegraph.explain(n["bert"], "decomposition", text="w1 w2 w3", groups="0-300000000")


def groups_huge_list(n, out):
    rulegraph.explain(n["bert"], "decomposition", text="w1 w2 w3", groups=[range(10**12)])


def bool_ids(n, out):
    inputs = tiny.token_inputs()
    rulegraph.explain(n["bert"], "gi", {**inputs, "input_ids": inputs["input_ids"] > 50})


def objective_overflow(n, out):
    from rulegraph.objective import parse
    parse("1e999*logit[1]")


def text_too_long(n, out):
    rulegraph.explain(n["bert"], "gi", text="w1 " * 40_000)


def _dataset(n, out, data="ok.csv", folder=None, force=False):
    from rulegraph.scale.explain import DatasetConfig, explain_dataset
    explain_dataset(DatasetConfig(n["bow"], f"{n['dir']}/{data}" if "/" not in data else data, "gi"),
                    Path(folder or out), force=force)


def dataset_link(n, out):
    _dataset(n, out, folder=n["links-dataset-summary.json"], force=True)


def dataset_journal_link(n, out):
    _dataset(n, out, folder=n["links-dataset-rows.jsonl"], force=True)


def dataset_data_is_journal(n, out):
    _dataset(n, out, data=f"{n['dir']}/data-in-out/rows.jsonl", folder=f"{n['dir']}/data-in-out", force=True)


def dataset_model_folder(n, out):
    _dataset(n, out, folder=n["hf"], force=True)


def dataset_huge_label(n, out):
    from rulegraph.scale.explain import DatasetConfig, explain_dataset
    explain_dataset(DatasetConfig(n["bow"], f"{n['dir']}/huge-label.jsonl", "gi", target="label"), out)


def evaluate_data_is_journal(n, out):
    from rulegraph.evaluate.runner import Config, Evaluation
    folder = Path(n["dir"]) / "data-in-out"
    Evaluation(Config(n["bow"], str(folder / "results.jsonl"), ["random"]), folder, force=True).run()


def evaluate_link(n, out):
    from rulegraph.evaluate.runner import Config, Evaluation
    Evaluation(Config(n["bow"], f"{n['dir']}/ok.csv", ["random"]), Path(n["links-evaluate-table.csv"]),
               force=True).run()


def _rows(name):
    def read(n, out):
        from rulegraph.scale.data import read_rows
        read_rows(Path(n["dir"]) / name, ["negative", "positive"], classes=2)
    read.__name__ = "read_" + name.split(".")[0]
    return read


read_unterminated, read_merged, read_ragged, read_twice, read_bool, read_fraction = (
    _rows(name) for name in ("unterminated.csv", "merged.csv", "ragged.csv", "twice.csv", "bool.jsonl",
                             "fraction.jsonl"))


def ray_beyond_cpus(n, out):
    from rulegraph.scale import engine
    engine("ray", num_workers=4096).check("cpu")


def ray_unreachable(n, out):
    from rulegraph.scale import engine
    engine("ray", address="127.0.0.1:1").check("cpu")


def ray_garbage(n, out):
    from rulegraph.scale import engine
    engine("ray", address="no such host:port").check("cpu")


#: (call, the exception class, the message's words)
CASES = [
    (load_pickled_weight, "ModelError", "weight 'l.weight' (ok/data/weights/model_weights_config.json) is pickled"),
    (load_pickled_inputs, "Refused", "holds an object that only a full unpickling could load"),
    (load_opaque, "ModelError", "is an opaque object; rulegraph never unpickles a model file"),
    (load_compiled, "ModelError", "holds AOTInductor compiled code"),
    (load_zip_bomb, "LimitError", "expands 1,029 times (65,232 → 67,108,864 bytes); a member may expand at most 100"),
    (explain_expand, "LimitError", "node 'expand' (Expand) would make a tensor of 30,000,000,000 elements"),
    (load_bad_labels, "ModelError", "rulegraph.labels must be a JSON list of at most 1,048,576 distinct class names"),
    (load_bad_length, "ModelError", "rulegraph.max_length must be an integer in 1…16,777,216"),
    (load_unknown_opset, "ModelError", "opset 99 of the default ONNX domain is not one rulegraph knows"),
    (generate_unbounded, "InputError", "100000 generated tokens need 100001 positions; the model takes at most 8192"),
    (groups_huge_range, "InputError", "position 300000000 is outside the input's 5 positions (0…4)"),
    (groups_huge_list, "InputError", "give at most 5 groups of at most 5 positions each"),
    (bool_ids, "InputError", "input input_ids must be int64, got bool"),
    (objective_overflow, "InputError", "coefficient 1e999 at column 1 is not a finite number"),
    (text_too_long, "InputError", "the text has 120,000 characters; rulegraph reads at most 100,000"),
    (dataset_link, "InputError", "summary.json is a symbolic link; rulegraph never writes through a link"),
    (dataset_journal_link, "InputError", "rows.jsonl is a symbolic link"),
    (dataset_data_is_journal, "InputError", "rows.jsonl is a file this run reads"),
    (dataset_model_folder, "InputError", "config.json is not the settings file of a rulegraph run"),
    (dataset_huge_label, "InputError", "label 10000000… is outside the model's 2 classes"),
    (evaluate_data_is_journal, "InputError", "results.jsonl is a file this run reads"),
    (evaluate_link, "InputError", "table.csv is a symbolic link"),
    (read_unterminated, "InputError", "unterminated.csv:2: a quoted field opened in the record starting on line 2"),
    (read_merged, "InputError", "merged.csv:2: a quoted field runs over lines 2…3"),
    (read_ragged, "InputError", "ragged.csv:2: the record has 3 fields, the header 2"),
    (read_twice, "InputError", "twice.csv:1: column 'text' appears twice"),
    (read_bool, "InputError", "bool.jsonl:1: row 1: label true is a boolean, not a class"),
    (read_fraction, "InputError", "fraction.jsonl:1: row 1: label 1.5 is not a class index"),
    (ray_beyond_cpus, "InputError", "--num-workers 4096 × --cpus-per-worker 1 = 4096 CPUs"),
    (ray_unreachable, "InputError", "no Ray cluster answers at 127.0.0.1:1"),
    (ray_garbage, "InputError", "is not a Ray address; valid: auto, HOST:PORT, ray://HOST:PORT"),
]
if importlib.util.find_spec("ray") is None:
    CASES = [c for c in CASES if not c[0].__name__.startswith("ray_")]


@pytest.fixture(scope="module")
def user(tmp_path_factory, bert_onnx):
    root = tmp_path_factory.mktemp("hostile_api")
    return root, hostile.build(root / "user", bert_onnx)


@pytest.fixture(scope="module")
def results(user):
    root, names = user
    cases = [{"id": f.__name__, "call": f"test_hostile_api:{f.__name__}", "out": str(root / "out" / f.__name__)}
             for f, _, _ in CASES]
    spec = root / "cases.json"
    spec.write_text(json.dumps({"folder": names["dir"], "names": names, "cases": cases}))
    done = root / "results.json"
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("run_bounded.py")), str(spec), str(done),
                          str(MEMORY), str(SECONDS)], capture_output=True, text=True, timeout=SECONDS * len(CASES))
    found = json.loads(done.read_text()) if done.exists() else {}
    assert run.returncode == 0 and len(found) == len(CASES), run.stderr[-3000:]
    return found


@pytest.mark.parametrize("call, error, message", CASES, ids=[c[0].__name__ for c in CASES])
def test_hostile_api_call_is_refused_in_one_line_within_bounds(results, user, call, error, message):
    case = results[call.__name__]
    assert case["code"] == error, case
    assert message in case["message"] and "\n" not in case["message"], case["message"]
    assert case["changed"] == [] and case["seconds"] < SECONDS
    assert not (user[0] / "user" / hostile.MARKER).exists()


def test_the_errors_are_rulegraph_errors():
    import rulegraph.errors as errors
    import rulegraph.loaders.pt2 as pt2
    for _, name, _ in CASES:
        cls = getattr(errors, name, None) or getattr(pt2, name)
        assert issubclass(cls, RulegraphError)


# -- what keeps working ---------------------------------------------------------------------------------

def test_a_plain_pt2_program_still_loads_and_explains(user):
    _, names = user
    x = torch.tensor([[1.0, 2.0, 3.0]])
    e = rulegraph.explain(names["pt2-ok"], "gi", {"x": x})
    graph = rulegraph.load(names["pt2-ok"])
    weight = next(t for t in graph.constants.values() if t.shape == (2, 3))
    torch.testing.assert_close(torch.as_tensor(e.scores("x"), dtype=torch.float64).flatten(),
                               (x[0] * weight[e.target[0]]).double(), rtol=1e-6, atol=1e-6)


def test_ig_on_a_model_with_a_fixed_batch_of_one_equals_the_batched_model(user):
    from rulegraph.methods import explain_with
    from rulegraph.text import TextEncoder
    _, names = user
    scores = []
    for key in ("bowfixed", "bow"):
        graph = rulegraph.load(names[key])
        enc = TextEncoder.for_model(graph, names[key], None).encode("w3 w7 w11 w2")
        e = explain_with(graph, "ig", {i.name: enc.inputs[i.name] for i in graph.inputs})   # 32 steps, batch 1
        assert abs(e.extra["completeness_gap"][0]) < 1e-5
        scores.append(torch.as_tensor(e.scores("input_ids")))
    torch.testing.assert_close(scores[0], scores[1])


def test_a_malformed_record_is_a_failed_row_and_the_plots_are_drawn(user, tmp_path):
    from rulegraph.evaluate.runner import Config, Evaluation
    _, names = user
    summary = Evaluation(Config(names["bow"], f"{names['dir']}/malformed.jsonl", ["random", "gi"],
                                metrics=["aopc"]), tmp_path / "eval").run()
    assert summary.failed["gi"]["texts"] == 1 and "not a JSON object" in summary.failed["gi"]["error"]
    assert (tmp_path / "eval" / "conservation.png").stat().st_size > 0     # was KeyError: 'logit'


def test_one_text_limit_for_csv_and_json_lines(user, tmp_path):
    from rulegraph.scale.explain import DatasetConfig, explain_dataset
    _, names = user
    errors = []
    for data in ("long.csv", "long.jsonl"):
        summary = explain_dataset(DatasetConfig(names["bow"], f"{names['dir']}/{data}", "gi"), tmp_path / data)
        assert summary["rows"] == 2 and summary["failed"] == 1
        errors.append(summary["first_error"].split(": ", 1)[1])
    assert errors[0] == errors[1] == "`text` has 1,200,000 characters; a data file's texts may have at most 100,000"


def test_a_journal_line_that_is_no_row_and_a_config_cut_short(user, tmp_path):
    from rulegraph.errors import InputError
    from rulegraph.scale.explain import DatasetConfig, explain_dataset
    _, names = user
    config, out = DatasetConfig(names["bow"], f"{names['dir']}/ok.csv", "gi"), tmp_path / "rows"
    assert explain_dataset(config, out)["rows"] == 3
    with (out / "rows.jsonl").open("a") as journal:
        journal.write("[1, 2]\n")
    with pytest.raises(InputError, match=r"rows\.jsonl:4: not a row rulegraph wrote"):
        explain_dataset(config, out)
    (out / "config.json").write_text('{"model": "sha256:')              # as a kill mid-write would leave it
    with pytest.raises(InputError, match="not valid JSON"):
        explain_dataset(config, out)
    assert explain_dataset(config, out, force=True)["rows"] == 3
    assert not (out / ".rulegraph.lock").exists()                         # released, and removed, at the end
