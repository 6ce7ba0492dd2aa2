"""What the views name: repeated words and tokens told apart by their positions, a generated
token's probability to 3 significant digits, figures drawn into a given axes, generation headers
upright and evaluate's headers whole on a narrow terminal."""
from __future__ import annotations

import re

import matplotlib
import pytest

import rulegraph
from rulegraph.cli import main

matplotlib.use("Agg")


def test_a_repeated_word_is_named_with_its_position(bert_onnx, capsys):
    """`explain -t "w1 w2 w1 w3 w1"`: the words for and against name each w1 by its place."""
    assert main(["explain", str(bert_onnx), "-r", "gi", "-t", "w1 w2 w1 w3 w1 w2"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("for:"))
    labels = re.findall(r"(\S+) [+-][0-9.e+-]+", line)
    assert labels and len(labels) == len(set(labels)), line
    assert not {"w1", "w2"} & set(labels) and {"w1#1", "w1#3", "w1#5"} & set(labels), line


def test_distinct_leaves_single_words_alone():
    from rulegraph.cli.render import distinct
    assert distinct([("a", 1.0), ("b", 2.0), ("a", 3.0)]) == [("a#1", 1.0), ("b", 2.0), ("a#3", 3.0)]


@pytest.fixture()
def generation(causal_lm):
    _, path = causal_lm
    return rulegraph.generate(path, "gi", text="w1 w2 w3", max_new_tokens=4, ignore_eos=True)


def test_probabilities_show_three_significant_digits(generation):
    shown = re.findall(r"p=(\S+?)(?:,|$)", repr(generation).splitlines()[1])
    assert len(shown) == 4
    for text, step in zip(shown, generation.steps):
        assert text == f"{step.probability:.3g}" and float(text) > 0      # a tiny model's p is never "0.00"


def test_matrix_columns_carry_their_step_numbers(generation):
    from rulegraph.cli.matrix import matrix_table, steps_table
    headers = [c.header for c in matrix_table(generation).columns[1:]]
    assert headers == [f"{i + 1} {c.strip() or repr(c)}" for i, c in enumerate(generation.columns)]
    probabilities = list(steps_table(generation).columns[2].cells)
    assert probabilities == [f"{s.probability:.3g}" for s in generation.steps]


def test_rows_a_step_relied_on_are_named_by_their_row_when_repeated(causal_lm):
    from rich.console import Console

    from rulegraph.cli.matrix import steps_table
    _, path = causal_lm
    g = rulegraph.generate(path, "gi", text="w1 w2 w1 w2", max_new_tokens=1, ignore_eos=True)
    console = Console(width=200, record=True, color_system=None)
    console.print(steps_table(g))
    top = console.export_text()
    named = re.findall(r"(w[12]\S*) [+-]", top)
    assert sorted(named) == ["w1#1", "w1#3", "w2#2", "w2#4"], top


def test_plots_draw_into_the_given_axes_with_upright_headers(generation, bert_onnx):
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2)
    assert generation.plot(ax=left) is fig and left.images and not right.images
    labels = left.get_xticklabels()
    assert [t.get_text() for t in labels] == [f"{i + 1}\n{c.strip() or repr(c)}"
                                              for i, c in enumerate(generation.columns)]
    assert all(t.get_rotation() == 0 for t in labels)
    e = rulegraph.explain(bert_onnx, "gi", text="w1 w2 w3")
    assert e.plot(ax=right) is fig and len(right.patches) == len(e.tokens[0])
    plt.close(fig)


def test_evaluate_headers_are_whole_on_a_narrow_terminal():
    from rich.console import Console

    from rulegraph.cli.evaluate import render_table
    from rulegraph.evaluate import metrics as M
    from rulegraph.evaluate.summary import Summary, header
    metrics = [M.METRICS.get(name) for name in M.METRICS.names()]
    cell = {"mean": 0.5, "low": 0.4, "high": 0.6, "n": 3}
    summary = Summary(table={"gi": {m.name: cell for m in metrics}}, curves={}, throughput={}, n_examples=3, rows=[])
    console = Console(width=80, record=True, color_system=None)
    console.print(render_table(summary, metrics))
    text = console.export_text()
    assert "…" not in text
    head = text[:text.index("┡")]                       # the header rows, each column read top to bottom
    lines = [line for line in head.splitlines() if line.startswith("┃")]
    columns = ["".join(cells).replace(" ", "") for cells in zip(*(line.strip("┃").split("┃") for line in lines))]
    for m in metrics:
        assert header(m).replace(" ", "") in columns, (header(m), columns)
