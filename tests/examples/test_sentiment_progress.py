"""examples/sentiment/progress.py: the demo's long steps print progress lines when logged (not a
terminal), every 10 % or 30 s with the elapsed time, and a bar on a terminal (a fake clock)."""
from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "sentiment"))
from progress import Steps, clock_text, phase  # noqa: E402


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def logged() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200), out


def test_a_logged_loop_prints_a_line_per_ten_percent_with_the_elapsed_time():
    console, out = logged()
    clock = Clock()
    assert not console.is_terminal
    with Steps(console, "training", 200, unit="batches", clock=clock, loss="–") as steps:
        for i in range(200):
            clock.now += 0.5
            steps.advance(loss=f"{1 / (i + 1):.3f}")
    lines = out.getvalue().splitlines()
    assert lines[0] == "training: 0/200 batches (0 %), 0:00 elapsed"
    assert [line.split(":")[1].split()[0] for line in lines] == [f"{n}/200" for n in range(0, 201, 20)]
    assert lines[5] == "training: 100/200 batches (50 %), 0:50 elapsed, loss 0.010"
    assert lines[-1] == "training: 200/200 batches (100 %), 1:40 elapsed, loss 0.005"


def test_a_slow_loop_prints_a_line_every_thirty_seconds_between_the_percentages():
    console, out = logged()
    clock = Clock()
    with Steps(console, "training", 1000, clock=clock) as steps:
        for _ in range(30):
            clock.now += 10
            steps.advance()
    lines = out.getvalue().splitlines()
    # 30 steps (3 %) over 300 s: a line at 30, 60 … 300 s, the last one also the end's
    assert [line.split(", ")[1] for line in lines] == ["0:00 elapsed"] + [f"{clock_text(t)} elapsed"
                                                                            for t in range(30, 301, 30)]
    assert lines[-1].startswith("training: 30/1,000 steps (3 %)")


def test_a_terminal_gets_a_bar_not_lines():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with Steps(console, "training", 50, clock=Clock()) as steps:
        for _ in range(50):
            steps.advance()
    shown = out.getvalue()
    assert "━" in shown and "50/50" in shown and "elapsed" not in shown


def test_a_step_without_sub_steps_says_when_it_starts_and_how_long_it_took():
    console, out = logged()
    clock = Clock()
    with phase(console, "Exporting to out/model.onnx", "Exported", clock=clock):
        clock.now += 75.2
    assert out.getvalue().splitlines() == ["Exporting to out/model.onnx…", "Exported in 1:15."]


@pytest.mark.parametrize("seconds, shown", [(0, "0:00"), (59.9, "0:59"), (104, "1:44"), (3725, "1:02:05")])
def test_clock_text(seconds, shown):
    assert clock_text(seconds) == shown
