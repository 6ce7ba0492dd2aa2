"""``explain-dataset`` on the local engine: the rows, resuming, failed rows, and bad input."""
from __future__ import annotations

import csv
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

import bow
import tiny
from listeners import StrictListener
from rulegraph.errors import InputError
from rulegraph.scale import Journal
from rulegraph.scale.explain import DatasetConfig, explain_dataset

TEXTS = ["w1 w2 w3", "w4 w5 w6 w7 w8", "w9", "w10 w11 w12 w13", "w14 w15", "w16 w17 w18 w19 w20 w21"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return bow.build(tmp_path_factory.mktemp("bow"))


def write_jsonl(path, records, extra=()):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "".join(extra))
    return path


@pytest.fixture
def data(tmp_path):
    return write_jsonl(tmp_path / "data.jsonl", [{"text": t, "label": i % 2} for i, t in enumerate(TEXTS)])


def rows(out):
    return pq.read_table(out / "explanations.parquet").to_pylist()


def test_gi_rows_equal_the_closed_form(model, data, tmp_path):
    """Bag of words: GI of a token for class c is W[id, c] (embedding × its unit gradient)."""
    summary = explain_dataset(DatasetConfig(str(model), str(data), "gi", batch=2), tmp_path / "out")
    assert summary["rows"] == len(TEXTS) and summary["failed"] == 0
    w = bow.table(bow.weights())
    for row in rows(tmp_path / "out"):
        assert row["tokens"][0] == "[CLS]" and len(row["relevance"]) == len(row["tokens"]) == len(row["ids"])
        expected = [float(w[i, row["target"]]) for i in row["ids"]]
        np.testing.assert_allclose(row["relevance"], expected, atol=1e-6)
        assert row["prediction"] == row["target"] and row["error"] is None
        assert row["gap"] == pytest.approx(row["output_value"] - row["relevance_sum"])
    assert [r["example"] for r in rows(tmp_path / "out")] == list(range(len(TEXTS)))


def test_the_listener_hears_start_then_progress_then_stop(model, data, tmp_path):
    """The progress of a run, then of a resumed run with nothing left: each start … stop, in the
    order the Listener defines (no method before start: the terminal's bar exists from start on)."""
    listener = StrictListener()
    config = DatasetConfig(str(model), str(data), "gi", batch=2)
    explain_dataset(config, tmp_path / "out", listener=listener)
    (start, total, pairs), = listener.named("start")
    advances = listener.named("advance")
    assert pairs == f"0/{len(TEXTS)} explained" and advances[-1][2] == f"{len(TEXTS)}/{len(TEXTS)} explained"
    assert total == sum(len(r["tokens"]) for r in rows(tmp_path / "out")) == sum(a[1] for a in advances)
    assert {m[1] for m in listener.named("method")} == {"gi"} and listener.calls[1] == ("method", "gi")
    explain_dataset(config, tmp_path / "out", listener=listener)
    listener.check(runs=2)
    assert listener.calls[-2:] == [("start", 1, f"{len(TEXTS)}/{len(TEXTS)} explained"), ("stop",)]


def test_without_progress_the_listener_hears_notes_only(model, tmp_path):
    """``progress=False`` (``-q``): no start, method, advance or stop reaches the listener; notes do."""
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": " ".join(f"w{i % 90}" for i in range(80))}])
    listener = StrictListener()
    explain_dataset(DatasetConfig(str(model), str(data), "gi"), tmp_path / "out", listener=listener, progress=False)
    assert listener.state == "new" and listener.calls and all(c[0] == "note" for c in listener.calls)


def test_the_model_folder_is_the_model_file_it_holds(model, data, tmp_path):
    """The folder ``rulegraph export`` writes stands for its model.onnx (tokenizer beside it): the
    same rows, and the same job (a run given the file resumes one given the folder)."""
    config = DatasetConfig(str(model.parent), str(data), "gi")
    explain_dataset(config, tmp_path / "folder")
    explain_dataset(DatasetConfig(str(model), str(data), "gi"), tmp_path / "file")
    drop = lambda rs: [{k: v for k, v in r.items() if k != "explain_seconds"} for r in rs]   # noqa: E731
    assert drop(rows(tmp_path / "folder")) == drop(rows(tmp_path / "file"))
    again = explain_dataset(DatasetConfig(str(model), str(data), "gi"), tmp_path / "folder")
    assert again["explained_now"] == 0


def test_target_label_explains_the_labelled_class(model, data, tmp_path):
    explain_dataset(DatasetConfig(str(model), str(data), "gi", target="label"), tmp_path / "out")
    assert [r["target"] for r in rows(tmp_path / "out")] == [i % 2 for i in range(len(TEXTS))]


def test_rule_sets_report_the_batch_audit(model, data, tmp_path):
    explain_dataset(DatasetConfig(str(model), str(data), "lrp-ah-ln"), tmp_path / "out")
    assert all(r["batch_error"] is not None and r["batch_error"] < 1e-5 for r in rows(tmp_path / "out"))


def test_a_malformed_record_is_a_failed_row_and_the_others_run(model, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in TEXTS[:2]], ['{"text": 3}\n', "[1, 2\n"])
    summary = explain_dataset(DatasetConfig(str(model), str(data), "gi"), tmp_path / "out")
    out = rows(tmp_path / "out")
    assert [r["example"] for r in out] == [0, 1, 2, 3]
    assert [r["error"] is None for r in out] == [True, True, False, False]
    assert "d.jsonl:3: `text` is a int" in out[2]["error"] and "d.jsonl:4: not a JSON object" in out[3]["error"]
    assert summary["failed"] == 2


def test_a_stopped_run_resumes_to_the_same_rows(model, data, tmp_path):
    config = DatasetConfig(str(model), str(data), "gi", batch=2)
    explain_dataset(config, tmp_path / "full")
    explain_dataset(config, tmp_path / "cut")
    journal = tmp_path / "cut" / "rows.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:2]) + lines[2][:10])        # stopped mid-line
    (tmp_path / "cut" / "explanations.parquet").unlink()
    summary = explain_dataset(config, tmp_path / "cut")
    assert summary["explained_now"] == len(TEXTS) - 2
    drop = lambda rs: [{k: v for k, v in r.items() if k != "explain_seconds"} for r in rs]   # noqa: E731
    assert drop(rows(tmp_path / "cut")) == drop(rows(tmp_path / "full"))
    assert len(Journal(journal).read()) == len(TEXTS)


def test_parquet_and_csv_data_give_the_same_rows(model, tmp_path):
    import pyarrow as pa
    with (tmp_path / "d.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows([["text"], *[[t] for t in TEXTS]])
    pq.write_table(pa.Table.from_pylist([{"text": t} for t in TEXTS]), tmp_path / "d.parquet")
    for name in ("d.csv", "d.parquet"):
        explain_dataset(DatasetConfig(str(model), str(tmp_path / name), "gi"), tmp_path / name.replace(".", "_"))
    a, b = rows(tmp_path / "d_csv"), rows(tmp_path / "d_parquet")
    assert [r["relevance"] for r in a] == [r["relevance"] for r in b]


@pytest.mark.parametrize("change, message", [
    ({"method": "nope"}, "unknown method 'nope'"),
    ({"target": "other"}, "unknown target 'other'; valid: predicted, label"),
    ({"options": {"steps": "x"}, "method": "ig"}, "ig.steps"),
])
def test_bad_settings_fail_before_any_file_is_written(model, data, tmp_path, change, message):
    config = DatasetConfig(**{"model": str(model), "data": str(data), "method": "gi", **change})
    with pytest.raises(InputError, match=message):
        explain_dataset(config, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_other_settings_in_the_folder_are_refused(model, data, tmp_path):
    explain_dataset(DatasetConfig(str(model), str(data), "gi"), tmp_path / "out")
    with pytest.raises(InputError, match=r"other settings \(method\); pass --force"):
        explain_dataset(DatasetConfig(str(model), str(data), "lrp-ah-ln"), tmp_path / "out")


def test_target_label_needs_labels(model, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": "w1 w2"}])
    with pytest.raises(InputError, match="record 0 of .* has no label"):
        explain_dataset(DatasetConfig(str(model), str(data), "gi", target="label"), tmp_path / "out")


def test_tiny_vocabulary_is_what_the_texts_use():
    assert all(w in tiny.VOCAB for t in TEXTS for w in t.split())


# --- --at and --top: each row's relevance per unit, and the units carrying most of it over the data set

UNIT_TEXTS = ["the cat sat on the mat", "a dog", "the mat sat"]


@pytest.fixture(scope="module")
def bert_units(bert_onnx, tmp_path_factory):
    folder = tmp_path_factory.mktemp("units")
    data = write_jsonl(folder / "data.jsonl", [{"text": t} for t in UNIT_TEXTS])
    config = DatasetConfig(model=str(bert_onnx), data=str(data), method="attnlrp", dtype="float64", batch=2,
                           at=["every attention output", "block 0 MLP activation"], top=5)
    return explain_dataset(config, folder / "out", progress=False), rows(folder / "out"), folder / "out"


def test_each_rows_units_are_its_own_explanations(bert_onnx, bert_units):
    """A row's per-unit relevance (its batch padded with others) equals the unit totals of its text explained
    alone (float64)."""
    import rulegraph
    import torch
    _, table, _ = bert_units
    for row in table:
        alone = rulegraph.explain(bert_onnx, "attnlrp", text=row["text"], dtype=torch.float64,
                                  at=["every attention output", "block 0 MLP activation"])
        expected = [x.per_unit()[0].tolist() for found in alone.inside.values() for x in found]
        assert [u["kind"] for u in row["units"]] == ["head", "head", "unit"]
        assert [u["block"] for u in row["units"]] == [0, 1, 0]
        for got, want in zip(row["units"], expected):
            assert np.allclose(got["relevance"], want, rtol=1e-9, atol=1e-14)


def test_the_top_units_carry_the_most_relevance_over_the_data_set(bert_units):
    summary, table, out = bert_units
    carried = {}
    for row in table:
        for u in row["units"]:
            for i, r in enumerate(u["relevance"]):
                carried[(u["value"], i)] = carried.get((u["value"], i), 0.0) + abs(r)
    strongest = sorted(carried.values(), reverse=True)[:5]
    top = json.loads((out / "top-units.json").read_text())
    assert top == summary["top_units"] and len(top) == 5
    assert [u["carried"] for u in top] == pytest.approx(strongest, rel=1e-12)
    assert all(u["examples"] == len(UNIT_TEXTS) for u in top)
    assert carried[(top[0]["value"], top[0]["unit"])] == pytest.approx(top[0]["carried"], rel=1e-12)


def test_top_needs_at_and_at_needs_a_rule_set(model, data, tmp_path):
    with pytest.raises(InputError, match="--top K ranks the units --at selects"):
        explain_dataset(DatasetConfig(model=str(model), data=str(data), method="gi", top=3), tmp_path / "a")
    with pytest.raises(InputError, match="--at reads the relevance pass"):
        explain_dataset(DatasetConfig(model=str(model), data=str(data), method="loo",
                                      at=["op Gemm"]), tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
