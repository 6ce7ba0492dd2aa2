"""Every ``rulegraph …`` command of README.md and docs/*.md runs as a user types it.

Each line of a fenced ``bash`` block that starts with ``rulegraph`` (continuation lines joined,
comments dropped; ``make``, ``pip``, ``python`` and ``ray`` lines are setup, not commands) runs
through the installed entry point in a child process, its output logged to files, in a folder
where each file it names exists as it names it: a tiny stand-in (:data:`STAND_INS`), or what the
docs command that writes it wrote (``rulegraph export qwen-hf qwen-out`` makes the
``qwen-out/model.onnx`` the next commands read; run once, here too). It must exit 0, print no
internal error, and leave every output it names (``--out``, ``--json``, ``--html``, ``--png``, ``--graph``,
export's folder). An optional part, ``[--alpha signed|abs|hybrid]``, is given with its first choice.

A command added to the docs is tested by being written: a file it reads that :data:`STAND_INS`
does not map fails :func:`test_every_file_a_command_reads_has_a_stand_in`, naming the table.
:data:`ADJUSTED` lists what this machine changes (no GPU, two cores, a Ray cluster of its own).
"""
from __future__ import annotations

import csv
import json
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

import tiny
from shell import on_terminal, rulegraph

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: four labelled texts of 20 tokens or more (the docs' evaluate asks for --min-length 20)
TEXTS = ["a gorgeous , witty movie " + " ".join(f"w{i}" for i in range(1, 18)),
         " ".join(f"w{i}" for i in range(20, 44)), "the plot is thin " + " ".join(f"w{i}" for i in range(50, 70)),
         " ".join(f"w{i}" for i in range(70, 92))]
PREFIXES = ["The capital of France is", "w1 w2 w3 w4 w5 w6", "w7 w8 w9 w10 w11"]

#: what stands for each file or folder the docs' commands read, by the name the docs give it: the
#: stand-ins made here to place in the command's folder (``MODEL``: a name, replaced by a file, see
#: :data:`NAMES`), or ``written by NAME``: what the docs command writing NAME wrote, under the docs' name
STAND_INS = {
    "out/model.onnx": ("out",),               # a tiny BERT classifier, exported, tokenizer.json beside it
    "model.onnx": ("model.onnx", "tokenizer.json"),
    "MODEL": ("out",),
    "qwen-hf": ("qwen-hf",),                  # a tiny Qwen2 causal LM saved with save_pretrained (+ tokenizer.json)
    "gpt2-hf": ("gpt2-hf",),                  # a tiny GPT-2 causal LM, the same way
    "qwen-out/model.onnx": "written by qwen-out",     # `rulegraph export qwen-hf qwen-out`
    "gpt2-out/model.onnx": "written by gpt2-out",     # `rulegraph export gpt2-hf gpt2-out`
    "lm-out/model.onnx": "written by gpt2-out",       # a causal LM's export: GPT-2's
    "masks.yaml": "written by masks.yaml",    # `rulegraph heads calibrate … --out masks.yaml`
    "tuned/tuned.yaml": "written by tuned",   # `rulegraph tune … --out tuned`
    "texts.csv": ("texts.csv",),              # TEXTS, labelled (the same in CSV, JSON lines, Parquet)
    "reviews.csv": ("reviews.csv",),
    "reviews.jsonl": ("reviews.jsonl",),
    "reviews.parquet": ("reviews.parquet",),
    "prefixes.csv": ("prefixes.csv",),        # 3 prompts for the causal LM
}
#: placeholders that are names, not files: replaced in the command by the file standing for them
NAMES = {"MODEL": "out/model.onnx"}
#: what this machine changes in a command: (option, docs value) → value here (None: dropped)
ADJUSTED = {
    ("--device", "cuda"): "cpu",              # no GPU here
    ("--gpus-per-worker", "*"): None,         # … so no GPUs for Ray workers either
    ("--num-workers", "*"): "2",              # two cores
    ("--address", "auto"): "{ray}",           # the Ray cluster this module starts, never another one found here
}
#: options whose value is a file or folder the command writes
OUTPUTS = ("--out", "--json", "--html", "--png", "--graph")
#: one command also run on a pseudo-terminal (colours, live bars): the first that matches
ON_TERMINAL = re.compile(r"^rulegraph explain MODEL ")


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    words: tuple[str, ...]      # as the docs write it (continuations joined, comment dropped)
    args: tuple[str, ...]       # what runs: optional parts given, placeholders replaced, ADJUSTED applied

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def text(self) -> str:
        return " ".join(shlex.quote(w) if not w or set(w) & set(" '\"$`") else w for w in self.words)


def optional_parts(words: list[str]) -> list[str]:
    """``[--alpha signed|abs|hybrid --threshold 0.1]`` → ``--alpha signed --threshold 0.1``."""
    out, inside = [], False
    for word in words:
        opens, closes = word.startswith("["), word.endswith("]")
        word = word[opens:len(word) - closes]
        out.append(word.split("|")[0] if inside or opens else word)
        inside = (inside or opens) and not closes
    return out


def adjusted(args: list[str]) -> list[str]:
    """The arguments with :data:`ADJUSTED` applied and :data:`NAMES` replaced."""
    out: list[str] = []
    k = 0
    while k < len(args):
        option = args[k]
        value = args[k + 1] if k + 1 < len(args) else None
        rule = next((v for (o, docs), v in ADJUSTED.items() if o == option and docs in (value, "*")), "keep")
        if rule == "keep":
            out.append(NAMES.get(option, option))
            k += 1
            continue
        if rule is not None:
            out += [option, rule]
        k += 2
    return out


def commands() -> list[Command]:
    """Each ``rulegraph`` line of the docs' ``bash`` blocks, once (by what runs), by file and line."""
    found, seen = [], set()
    for doc in DOCS:
        text = doc.read_text()
        for block in re.finditer(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
            first = text[:block.start(1)].count("\n") + 1
            lines = block.group(1).split("\n")
            k = 0
            while k < len(lines):
                start, joined = k, lines[k]
                while joined.rstrip().endswith("\\") and k + 1 < len(lines):
                    k += 1
                    joined = joined.rstrip()[:-1] + " " + lines[k].strip()
                k += 1
                words = shlex.split(joined, comments=True)
                if not words or words[0] != "rulegraph":
                    continue
                args = tuple(adjusted(optional_parts(words)[1:]))
                if args in seen:            # the same command in two places runs once
                    continue
                seen.add(args)
                found.append(Command(str(doc.relative_to(ROOT)), first + start, tuple(words), args))
    return found


COMMANDS = commands()


def outputs(args: tuple[str, ...]) -> list[str]:
    """The files and folders a command writes: its --out, --json, --html, --png (``NAME``:
    ``NAME.png``), export's OUT_DIR."""
    named = [args[k + 1] + (".png" if a == "--png" and not Path(args[k + 1]).suffix else "")
             for k, a in enumerate(args[:-1]) if a in OUTPUTS]
    if args[0] == "export":
        named.append([a for a in args[1:] if not a.startswith("-")][1])
    return [n.rstrip("/") for n in named]


def is_path(word: str) -> bool:
    """A file or folder name: ``a/b``, ``x.csv``, or a placeholder in capitals (``MODEL``)."""
    if not re.fullmatch(r"[A-Za-z0-9_./-]+", word):
        return False
    try:
        float(word)
        return False
    except ValueError:
        return "/" in word or bool(re.search(r"\.[A-Za-z]\w*$", word)) or word.isupper()


def reads(command: Command) -> list[str]:
    """The files and folders the command reads, by the docs' names: its argument (the model, or
    the folder export reads), option values and a method option's value (``-o masks=masks.yaml``)
    that name files, and not what it writes."""
    words = optional_parts(list(command.words))[1:]
    written = set(outputs(tuple(words)))
    first = next(k for k, w in enumerate(words) if k and not w.startswith("-") and w != "calibrate")
    found = []
    for k, word in enumerate(words):
        if word.startswith("-") or (k and words[k - 1] in OUTPUTS):
            continue
        value = word.partition("=")[2] if k and words[k - 1] in ("-o", "--option") else word
        if (k == first or is_path(value)) and value.rstrip("/") not in written:
            found.append(value)
    return found


def writer(name: str) -> Command:
    """The docs command that writes ``name``."""
    for command in COMMANDS:
        if name in outputs(command.args):
            return command
    raise AssertionError(f"no docs command writes {name} (STAND_INS says one does)")


# ---- the stand-ins ------------------------------------------------------------------------------------


def _texts(folder: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    records = [{"text": t, "label": i % 2} for i, t in enumerate(TEXTS)]
    with (folder / "texts.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows([["text", "label"], *[[r["text"], r["label"]] for r in records]])
    for name in ("reviews.csv",):
        shutil.copy(folder / "texts.csv", folder / name)
    (folder / "reviews.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    pq.write_table(pa.Table.from_pylist(records), folder / "reviews.parquet")


class Workspace:
    """The stand-ins, made once; the outputs of the docs commands other commands read, written
    once by running those commands; a fresh folder per command holding what it reads."""

    def __init__(self, root: Path, classifier: Path, ray_address: str):
        self.root, self.ray = root, ray_address
        self.made = root / "made"
        (self.made / "out").mkdir(parents=True)
        shutil.copy(classifier, self.made / "out" / "model.onnx")
        shutil.copy(classifier.parent / "tokenizer.json", self.made / "out" / "tokenizer.json")
        shutil.copy(classifier, self.made / "model.onnx")
        shutil.copy(classifier.parent / "tokenizer.json", self.made / "tokenizer.json")
        tiny.save_causal_lm("qwen2", self.made / "qwen-hf")
        tiny.save_causal_lm("gpt2", self.made / "gpt2-hf")
        _texts(self.made)
        with (self.made / "prefixes.csv").open("w", newline="") as handle:
            csv.writer(handle).writerows([["text"], *[[p] for p in PREFIXES]])
        self.ran: dict[str, tuple] = {}

    def folder(self, command: Command) -> Path:
        """A folder for ``command`` holding each file it reads under the docs' name."""
        here = self.root / re.sub(r"\W", "_", command.id)
        here.mkdir()
        for name in reads(command):
            stand_in = STAND_INS[name]
            if isinstance(stand_in, str):
                top = stand_in.removeprefix("written by ")
                links = {Path(name).parts[0]: self.run(writer(top))[1] / top}
            else:
                links = {made: self.made / made for made in stand_in}
            for link, source in links.items():
                if not (here / link).exists():
                    (here / link).symlink_to(source.resolve(), target_is_directory=source.is_dir())
        return here

    def run(self, command: Command):
        """``command`` run once: (what ran, the folder it ran in)."""
        if command.id not in self.ran:
            here = self.folder(command)
            args = [a.replace("{ray}", self.ray) for a in command.args]
            self.ran[command.id] = (rulegraph(args, here, timeout=600), here)
        return self.ran[command.id]


@pytest.fixture(scope="module")
def ray_address():
    """A Ray cluster of two CPUs for the commands that join one (``--address auto``), shut at the end."""
    if not any("{ray}" in " ".join(c.args) for c in COMMANDS):
        yield ""
        return
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def workspace(bert_onnx, ray_address, tmp_path_factory):
    return Workspace(tmp_path_factory.mktemp("docs_commands"), Path(bert_onnx), ray_address)


# ---- the tests ----------------------------------------------------------------------------------------


def test_the_docs_have_commands():
    subcommands = {c.args[0] for c in COMMANDS}
    assert {"explain", "audit", "check", "export", "evaluate", "explain-dataset", "heads"} <= subcommands, subcommands


@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_every_file_a_command_reads_has_a_stand_in(command):
    missing = [name for name in reads(command) if name not in STAND_INS]
    assert not missing, (f"{command.id}: `{command.text}` reads {', '.join(missing)}, which STAND_INS in "
                         f"tests/test_docs_commands.py does not map: add a tiny stand-in for it there (or, where "
                         f"a docs command writes it, 'written by NAME')")


@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_command_runs(command, workspace):
    ran, here = workspace.run(command)
    assert ran.code == 0 and "internal error" not in ran.out + ran.err, (
        f"{command.id}: `{command.text}`\nran: rulegraph {shlex.join(command.args)}\nexit {ran.code}\n"
        f"--- stdout\n{ran.out}\n--- stderr\n{ran.err}")
    for name in outputs(command.args):
        assert (here / name).exists(), f"{command.id}: `{command.text}` exited 0 without writing {name}"


def test_a_command_on_a_terminal(workspace):
    command = next(c for c in COMMANDS if ON_TERMINAL.match(c.text))
    ran = on_terminal(list(command.args), workspace.folder(Command(command.doc, 0, command.words, command.args)))
    assert ran.code == 0 and "internal error" not in ran.out, f"{command.id} on a terminal:\n{ran.out}"
    assert "\x1b[" in ran.out and "conserv" in ran.out.lower(), ran.out


def test_a_file_without_a_stand_in_is_named():
    """What a new docs command reading a file the table lacks meets (the parametrized check above)."""
    words = shlex.split("rulegraph explain new-out/model.onnx -r gi --data new.csv --json e.json")
    command = Command("docs/new.md", 1, tuple(words), ())
    assert [name for name in reads(command) if name not in STAND_INS] == ["new-out/model.onnx", "new.csv"]
