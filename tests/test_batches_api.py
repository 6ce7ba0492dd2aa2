"""A batch explanation in Python as the command line shows it: items by index, one argument order,
a repr that lists every item; method options passed one way to explain and generate; errors in
Python terms, and errors with a next step on the command line."""
import pytest
import torch

import rulegraph
from rulegraph.errors import InputError

TEXTS = ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9"]


@pytest.fixture(scope="module")
def batch(bert_onnx):
    return rulegraph.explain(bert_onnx, "attnlrp", text=TEXTS, dtype=torch.float64)


def test_a_batch_has_a_length_items_and_iteration(batch, bert_onnx):
    assert len(batch) == 3 and [len(x) for x in batch] == [1, 1, 1]
    for i, text in enumerate(TEXTS):
        item, alone = batch[i], rulegraph.explain(bert_onnx, "attnlrp", text=text, dtype=torch.float64)
        assert item.tokens == alone.tokens and item.texts == alone.texts and item.extra["text"] == text
        assert item.target == [batch.target[i]] and item.output_value == [batch.output_value[i]]
        assert item.scores() == batch.scores(i) and item.words() == batch.words(i)
        assert item.scores() == pytest.approx(alone.scores(), abs=1e-9)        # its own tokens, no padding
        assert item.to_dict()["relevance"]["input_ids"] == item.scores()
    assert batch[-1].scores() == batch.scores(2)


def test_the_item_comes_first_and_the_input_name_is_a_keyword(batch):
    assert batch.scores(1) == batch.scores(item=1) == batch.scores(1, key="input_ids")
    assert batch.scores("input_ids", 1) == batch.scores(1)          # the former order, told apart by type
    assert batch.scores(None, 1) == batch.scores(1)
    assert batch.words(2) == batch.words("input_ids", 2) == batch.words(item=2, key="input_ids")
    assert batch.scores(1) != batch.scores(0)


@pytest.mark.parametrize("call, message", [
    (lambda b: b.scores(3), "item 3 is not in this batch of 3"),
    (lambda b: b[5], "item 5 is not in this batch of 3"),
    (lambda b: b.scores(0, key="pixels"), "no input named 'pixels'"),
    (lambda b: b.scores(0, 1), "key is an input name"),
    (lambda b: b.plot(7), "item 7 is not in this batch of 3"),
    (lambda b: b["input_ids"], "a batch item is an int"),
])
def test_a_wrong_item_or_input_is_a_one_line_error(batch, call, message):
    with pytest.raises(InputError, match=message) as caught:
        call(batch)
    assert "\n" not in str(caught.value)


def test_a_batch_repr_lists_every_item_and_an_item_says_its_audit_is_the_batch(batch):
    text = repr(batch)
    assert "a batch of 3 items" in text
    assert [line.lstrip()[:3] for line in text.splitlines()[1:4]] == ["[0]", "[1]", "[2]"]
    assert "w6w7w8w9" in text.replace(" ", "") and "the batch's 3 items summed" in text
    item = repr(batch[1])
    assert "item 1 of a batch of 3" in item and "batch audit" in item and "w4" in item
    assert batch[1].audit is batch.audit


PROMPT = "w1 w2 w3 w4 w5"


def test_method_options_pass_as_keywords_to_explain_and_generate(causal_lm):
    _, path = causal_lm
    g = rulegraph.generate(path, "ig", text=PROMPT, max_new_tokens=1, steps=4, dtype=torch.float64)
    g8 = rulegraph.generate(path, "ig", text=PROMPT, max_new_tokens=1, steps=8, dtype=torch.float64)
    four = rulegraph.explain(path, "ig", text=PROMPT, steps=4, dtype=torch.float64)
    eight = rulegraph.explain(path, "ig", text=PROMPT, steps=8, dtype=torch.float64)
    assert g.steps[0].scores != pytest.approx(g8.steps[0].scores, abs=1e-9)     # steps reached IG, both ways
    assert four.scores() != pytest.approx(eight.scores(), abs=1e-9)
    with pytest.warns(UserWarning, match="options"):
        old = rulegraph.generate(path, "ig", text=PROMPT, max_new_tokens=1, options={"steps": 4}, dtype=torch.float64)
    assert old.steps[0].scores == g.steps[0].scores


def test_steps_read_as_tokens_or_as_igs_option_is_refused_with_the_way_out(causal_lm):
    _, path = causal_lm
    with pytest.raises(InputError, match=r"steps=16 is ambiguous: ig's option steps, or the former name of "
                                         r"max_new_tokens; give max_new_tokens=N") as caught:
        rulegraph.generate(path, "ig", text=PROMPT, steps=16)
    assert "\n" not in str(caught.value)
    with pytest.raises(InputError, match="steps given twice"):
        rulegraph.generate(path, "ig", text=PROMPT, max_new_tokens=1, steps=4, options={"steps": 4})
    with pytest.raises(InputError, match=r"give ig's options as keywords \(steps=4\), not options=\{…\}"):
        rulegraph.explain(path, "ig", text=PROMPT, options={"steps": 4})
    with pytest.warns(UserWarning, match="max_new_tokens"):      # no such option: still the former name
        g = rulegraph.generate(path, "gi", text=PROMPT, steps=2, ignore_eos=True)
    assert len(g.steps) == 2


def test_encode_speaks_python_and_the_command_line_its_flags(bert_onnx, tmp_path, capsys):
    import shutil
    from rulegraph.cli import main
    lone = tmp_path / "model.onnx"
    shutil.copy(bert_onnx, lone)                      # no tokenizer.json beside it
    with pytest.raises(InputError, match=r"text needs a tokenizer: give tokenizer=PATH") as caught:
        rulegraph.encode(lone, "w1 w2")
    assert "--" not in str(caught.value)
    assert main(["explain", str(lone), "-r", "gi", "-t", "w1 w2"]) == 2
    assert "--text needs --tokenizer PATH" in capsys.readouterr().err


def _cli_error(capsys, *argv) -> str:
    from rulegraph.cli import main
    assert main([str(a) for a in argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_text_on_an_image_model_says_to_give_an_image(capsys, tmp_path):
    import cnn
    model = cnn.onnx(cnn.build("cnn"), tmp_path / "cnn.onnx", cnn.image(1, 16))
    line = _cli_error(capsys, "explain", model, "-r", "epsilon-gamma-box", "-t", "a cat")
    assert "this model takes an image (input 'pixel_values'), not text; give --image PATH" in line
    with pytest.raises(InputError, match=r"not text; give image=PATH \(a path, a PIL image or an array\)"):
        rulegraph.explain(model, "epsilon-gamma-box", text="a cat")


def test_a_cnn_rule_set_on_a_language_model_names_the_rule_set_to_use(capsys, causal_lm):
    _, path = causal_lm
    line = _cli_error(capsys, "explain", path, "-r", "epsilon-gamma-box", "-t", "w1 w2")
    assert "epsilon-gamma-box is a CNN rule set (`models: cnns`)" in line
    assert line.endswith("for language models use attnlrp") and len(line) < 300


def test_a_model_name_that_is_not_a_file_says_how_to_export_it(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _cli_error(capsys, "explain", "gpt2", "-r", "attnlrp", "-t", "w1")
    assert "model file not found: gpt2" in line and "`rulegraph export HF_FOLDER OUT`" in line


def test_an_item_renders_as_a_page_and_a_figure(batch):
    item = batch[2]
    assert "w9" in item._repr_html_() and "w9" in item.to_html()
    assert len(item.plot().axes) >= 1 and len(batch.plot(2).axes) >= 1


def test_an_image_batch_lists_each_picture(tmp_path):
    import cnn
    model = cnn.onnx(cnn.build("cnn"), tmp_path / "cnn.onnx", cnn.image(1, 16))
    b = rulegraph.explain(model, "epsilon-gamma-box", {"pixel_values": cnn.image(2, 16)}, dtype=torch.float64)
    text = repr(b)
    assert len(b) == 2 and "[0]" in text and "[1]" in text and "strongest" in text
    assert b[1].boundary["pixel_values"].shape[0] == 1 and b[1].pixels["pixel_values"].shape[0] == 1
    assert "item 1 of a batch of 2" in repr(b[1]) and "image pixel_values" in repr(b[1])


def test_the_command_line_passes_igs_steps_to_generation(capsys, causal_lm):
    import json
    _, path = causal_lm
    from rulegraph.cli import main
    runs = []
    for steps in (4, 8):
        assert main(["explain", str(path), "--method", "ig", "-o", f"steps={steps}", "-t", PROMPT, "--generate", "1",
                     "--json", "-", "--dtype", "float64"]) == 0
        runs.append(json.loads(capsys.readouterr().out)["steps"][0]["scores"])
    direct = rulegraph.generate(path, "ig", text=PROMPT, max_new_tokens=1, steps=4, dtype=torch.float64)
    assert runs[0] == pytest.approx(direct.steps[0].scores, abs=1e-12) and runs[0] != pytest.approx(runs[1], abs=1e-9)


def _bars(figure) -> int:
    return max(len(a.patches) for a in figure.axes)


def test_an_item_covers_its_own_tokens_in_every_view(batch):
    """Item 1 ("w4 w5": 4 tokens with [CLS]/[SEP]) of a batch padded to 6: its scores, words, repr,
    page, figure and JSON hold its 4 tokens, as its explanation alone does; so do the batch's views of it."""
    n = [len(t) for t in batch.tokens]
    assert n == [5, 4, 6] and batch.relevance["input_ids"].shape == (3, 6)       # padded to the longest
    item = batch[1]
    assert len(item.scores()) == len(batch.scores(1)) == 4 and item.relevance["input_ids"].shape == (1, 4)
    assert item.boundary["input_ids"].shape[:2] == (1, 4)
    assert [w for w, _ in item.words()] == ["w4", "w5"] == [w for w, _ in batch.words(1)]
    assert len(item.to_dict()["relevance"]["input_ids"]) == 4
    assert [len(r) for r in batch.to_dict()["relevance"]["input_ids"]] == [5, 4, 6]
    assert _bars(item.plot()) == _bars(batch.plot(1)) == 4
    assert item.to_html().count('class="tok') == batch[0].to_html().count('class="tok') - 1


def test_inputs_with_a_mask_are_trimmed_as_text_is(bert_onnx, batch):
    """The ids and mask given as tensors: the items' scores and tokens leave the padding out as with text=."""
    ids = torch.zeros(3, 6, dtype=torch.int64)
    mask = torch.zeros(3, 6, dtype=torch.int64)
    for b, text in enumerate(TEXTS):
        one = rulegraph.encode(bert_onnx, text).inputs["input_ids"][0]
        ids[b, :len(one)], mask[b, :len(one)] = one, 1
    e = rulegraph.explain(bert_onnx, "attnlrp", {"input_ids": ids, "attention_mask": mask,
                                                 "token_type_ids": torch.zeros_like(ids)}, dtype=torch.float64)
    for i in range(3):
        assert e.tokens[i] == batch.tokens[i] and e[i].tokens == [batch.tokens[i]]
        assert e.scores(i) == pytest.approx(batch.scores(i), abs=1e-12) == e[i].scores()
