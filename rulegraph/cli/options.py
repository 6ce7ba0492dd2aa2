"""Options shared by the commands. Only light modules are imported here, so ``--help`` is fast."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import click

from ..errors import InputError
from ..image import IMAGENET_MEAN, IMAGENET_STD
from ..options import DTYPE_NAMES, PASS_OPTIONS, Option
from ..rules import shipped_rule_sets
from ..scale import ENGINES

DTYPES = DTYPE_NAMES


#: the sections of ``--help`` (:class:`Grouped`), by option name, in the order shown
SECTIONS = {
    "Method": ("rules", "method", "method_option", "groups", "alpha", "threshold", "variant", "mode"),
    "Input": ("texts", "question", "tokenizer", "raw_inputs", "image_path", "image_size", "image_resize", "image_mean",
              "image_std", "audio_path"),
    "What is explained": ("target", "contrast", "objective", "region", "score", "position", "output_name"),
    "Inside the model": ("at", "condition"),
    "Language models": ("generate_n", "continuation", "batch", "ignore_eos"),
    "Outputs": ("json_path", "html_path", "png_path", "graph_paths", "force", "top", "all_nodes"),
    "Running": ("device", "dtype"),
}


class Grouped(click.Command):
    """A command whose ``--help`` lists its options in the sections of :data:`SECTIONS`."""

    def format_options(self, ctx, formatter):
        rows: dict[str, list] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            section = next((k for k, names in SECTIONS.items() if param.name in names), "Other")
            rows.setdefault(section, []).append(record)
        for section in [*SECTIONS, "Other"]:
            if rows.get(section):
                with formatter.section(section):
                    formatter.write_dl(rows[section])


class OutputPath(click.ParamType):
    """A file to write (``-``: standard output); an empty value is refused, not read as ``.``.
    With ``suffix`` (``.png``), a name without one gets it: the file checked (``--force``) is the
    file written."""

    name = "path"

    def __init__(self, suffix: str = ""):
        self.suffix = suffix

    def convert(self, value, param, ctx):
        if not isinstance(value, Path) and not str(value).strip():
            raise InputError(f"{param.opts[0] if param else 'the output'} is an empty path; give a file name, "
                             "or '-' for standard output")
        path = Path(value)
        if self.suffix and str(value) != "-" and not path.suffix:
            path = path.with_name(path.name + self.suffix)
        return path


OUTPUT = OutputPath()
#: a PNG file to write: ``NAME`` is ``NAME.png``
PNG = OutputPath(".png")


class TokenOrId(click.ParamType):
    """A class / vocabulary id (an integer), or text: a class name, or one token's text (resolved by
    :func:`rulegraph.explain` from the model's labels or tokenizer)."""

    name = "id|text"

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value)
        if not text.strip():
            raise InputError(f"{param.opts[0] if param else 'the target'} is empty; give a class id or the text "
                             "of one token")
        try:
            return int(text.strip())
        except ValueError:
            return text


TOKEN_OR_ID = TokenOrId()


class TargetList(click.ParamType):
    """``--targets all | top-K | A,B,…``: several targets of one forward; a list's items are class
    indices, class names or token texts (a token holding a comma cannot be listed: give its id)."""

    name = "targets"

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.lower() == "all" or text.lower().startswith("top-"):
            return text.lower()
        items = [item for item in text.split(",")]
        if not text or any(not item.strip() for item in items):
            raise InputError(f"--targets {value!r}: give all, top-K or a comma-separated list of classes "
                             "(indices, names or token texts)")
        return [int(item) if item.strip().lstrip("-").isdigit() else item for item in items]


TARGETS = TargetList()


class ModelPath(click.ParamType):
    """MODEL: an exported model file (``.onnx``, ``.pt2``), or the folder ``rulegraph export`` wrote
    (``model.onnx`` + ``tokenizer.json``). Every command reads the file that
    :func:`rulegraph.loaders.onnx.model_file` names (a missing path, a Hugging Face folder that was
    not exported: one line saying so), so that a command's inputs, its job's identity and the
    ``tokenizer.json`` beside the model are those of the same file."""

    name = "path"

    def convert(self, value, param, ctx):
        from ..loaders.onnx import model_file
        return model_file(Path(value))


def model_argument(f):
    """The ``MODEL`` argument of every command that reads an exported model (:class:`ModelPath`)."""
    return click.argument("model", type=ModelPath())(f)


def rules_option(f):
    names = ", ".join(shipped_rule_sets(None))
    return click.option("--rules", "-r", required=True, metavar="NAME|PATH",
                        help=f"a shipped rule set ({names}) or a YAML rule file")(f)


class MethodOption(click.Option):
    """``--method``: its help names the baselines, read from their registry when the help is shown (the
    registry imports torch; loading a command for its ``--help`` does not)."""

    def get_help_record(self, ctx):
        if "{baselines}" in (self.help or ""):
            from ..methods import BASELINES
            self.help = self.help.replace("{baselines}", ", ".join(BASELINES))
        return super().get_help_record(ctx)


def method_options(f):
    """``explain``: a rule set (--rules) or any method (--method: baselines too), with -o options."""
    names = ", ".join(shipped_rule_sets(None))
    for decorator in reversed([
        click.option("--rules", "-r", metavar="NAME|PATH", help=f"a shipped rule set ({names}) or a YAML rule file"),
        click.option("--method", "-m", metavar="NAME", cls=MethodOption,
                     help="instead of --rules: any method of `rulegraph methods` — a rule set, or a baseline "
                          "({baselines})"),
        click.option("--option", "-o", "method_option", multiple=True, metavar="KEY=VALUE",
                     help="an option of the --method, e.g. -o steps=50 for ig (repeatable)"),
    ]):
        f = decorator(f)
    return f


def input_options(f):
    for decorator in reversed([
        click.option("--text", "-t", "texts", multiple=True, metavar="TEXT",
                     help="text to explain (repeatable; each is explained on its own)"),
        click.option("--question", default=None, metavar="TEXT",
                     help="span QA: the question, encoded before each --text (the context); explain "
                          "--output start_logits or end_logits, --target a token position"),
        click.option("--tokenizer", type=click.Path(exists=False, path_type=Path), metavar="PATH",
                     help="tokenizer.json (default: the one next to the model)"),
        click.option("--input", "-i", "raw_inputs", multiple=True, metavar="NAME=V1,V2,…|NAME=FILE.npy",
                     help="a model input as comma-separated values (one row) or a .npy file (repeatable)"),
        click.option("--target", type=TOKEN_OR_ID, default=None,
                     help="the class to explain, by index or by name (default: the argmax); for a language model "
                          "the text of one token, e.g. \" Paris\" (tokenized with the model's tokenizer)"),
        click.option("--contrast", type=TOKEN_OR_ID, default=None,
                     help="explain target − contrast: a class (index or name), the text of one token, or runner-up "
                          "(the highest class other than the target)"),
        click.option("--objective", default=None, metavar="EXPR",
                     help="explain a linear expression of one position's logits and log-probabilities instead, "
                          "e.g. 'logprob[\" Paris\"] - logprob[\" London\"]' or '0.5*logit[2] + logit[3]' "
                          "(tokens as ids or quoted text; at most 64 terms; see rulegraph.objective)"),
        click.option("--region", default=None, metavar="Y0:Y1,X0:X1",
                     help="for a map output [batch, channels, H, W]: explain its sum over rows Y0…Y1−1 and "
                          "columns X0…X1−1 (the objective region[Y0:Y1, X0:X1])"),
        click.option("--score", type=click.Choice(["logit", "logprob", "probability"]), default="logit",
                     show_default=True,
                     help="the logit, or the log-probability log softmax(z)[target] (explained as "
                          "z[target] − Σ p·z with p held constant); a final Softmax / LogSoftmax is explained as "
                          "its logits, unless probability (its output itself)"),
        click.option("--position", type=int, default=None,
                     help="for [batch, positions, classes] outputs: the position explained (default: last)"),
        click.option("--output", "output_name", default=None,
                     help="the value to explain: a graph output (default: the first) or any value of the graph, "
                          "e.g. the logits before a final Softmax or a hidden state"),
        click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True),
        click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True),
    ]):
        f = decorator(f)
    return f


def image_options(f):
    """``explain --image``: preprocessing (see rulegraph.image) and the heatmap PNG; ``--audio`` (rulegraph.audio)."""
    floats = click.Tuple([float, float, float])
    for decorator in reversed([
        click.option("--image", "image_path", type=click.Path(path_type=Path), metavar="PATH",
                     help="an image for a vision model, in the input's layout (NCHW or NHWC): resized, "
                          "center-cropped where the model fixes both sides (said in the output), normalised "
                          "(see --size, --mean)"),
        click.option("--audio", "audio_path", type=click.Path(path_type=Path), metavar="FILE.wav",
                     help="a clip for an audio model (a PCM WAV file): channels averaged, resampled to the export's "
                          "rulegraph.sampling_rate, normalised as its feature extractor says; relevance over time"),
        click.option("--png", "png_path", type=PNG, metavar="OUT",
                     help="write a figure as a PNG: the tokens' scores, an image's heatmap (default with --image and "
                          "--html: beside the page), a clip's relevance over its waveform, a generation's matrix"),
        click.option("--size", "image_size", metavar="N|H,W", default=None,
                     help="the model's image size: N (square) or H,W [default: the input's declared H×W (a free "
                          "width keeps the image's aspect ratio), else the export's rulegraph.image_size, else 224]"),
        click.option("--resize", "image_resize", type=click.IntRange(min=1), default=None,
                     help="the shorter side of the crop's box, resized to before the center crop [default: the "
                          "model's own size; 256 for the 224 default]"),
        click.option("--mean", "image_mean", type=floats, default=None,
                     help=f"per-channel mean subtracted (R G B) [default: the export's rulegraph.image_mean, "
                          f"else {' '.join(map(str, IMAGENET_MEAN))}]"),
        click.option("--std", "image_std", type=floats, default=None,
                     help=f"per-channel std divided by (R G B) [default: the export's rulegraph.image_std, "
                          f"else {' '.join(map(str, IMAGENET_STD))}]"),
    ]):
        f = decorator(f)
    return f


#: flags renamed, still accepted (hidden) for one release: old flag name → the option's name now
RENAMED = {"lambda": "threshold"}


def _pass_flags() -> dict[str, tuple[Option, str]]:
    """Every pass option the command line shows, by name, with the pass that declares it."""
    flags: dict[str, tuple[Option, str]] = {}
    for name, declared in PASS_OPTIONS.items():
        for o in declared:
            if o.cli:
                flags.setdefault(o.name, (o, name))
    return flags


def pass_options(f):
    """The passes' options (:data:`rulegraph.options.PASS_OPTIONS`) as flags, e.g. ``--groups``,
    ``--alpha`` of the decomposition pass: each applies to rule sets whose pass declares it."""
    decorators = [click.option(o.flag, o.name, default=None,
                               metavar=o.metavar or "|".join(map(str, o.choices)) or o.type_name(),
                               help=f"{name} pass: {o.help}") for o, name in _pass_flags().values()]
    decorators += [click.option(f"--{old}", f"renamed_{old}", default=None, hidden=True) for old in RENAMED]
    for decorator in reversed(decorators):
        f = decorator(f)
    return f


def pass_arguments(ruleset, opts: dict) -> dict:
    """The pass's own :func:`~rulegraph.explain` arguments from the command's flags, checked against
    the declaration: only those the rule set's pass takes."""
    import warnings
    flags = _pass_flags()
    given = {name: opts[name] for name in flags if opts.get(name) is not None}
    for old, new in RENAMED.items():
        if opts.get(f"renamed_{old}") is not None:
            warnings.warn(f"--{old} is now --{new.replace('_', '-')}; --{old} will be removed", stacklevel=2)
            given.setdefault(new, opts[f"renamed_{old}"])
    if ruleset is None:
        if given:
            raise InputError(f"{flags[next(iter(given))][0].flag} applies to rule sets (--rules), not to --method")
        return {}
    declared = {o.name: o for o in PASS_OPTIONS.get(ruleset.pass_name, ())}
    refused = [name for name in given if name not in declared]
    if refused:
        option, owner = flags[refused[0]]
        raise InputError(f"{option.flag} applies to rule sets with `pass: {owner}` only; "
                         f"{ruleset.name or ruleset.source} runs the {ruleset.pass_name} pass")
    return {name: declared[name].parse(value) for name, value in given.items()}


class Bounded(click.ParamType):
    """An int or float in ``low…high`` (inclusive; ``None``: unbounded); a value outside is one
    ``error:`` line naming the option and its valid range."""

    def __init__(self, type_: type = int, low: float | None = None, high: float | None = None):
        self.type, self.low, self.high = type_, low, high
        self.name = type_.__name__

    def range(self) -> str:
        if self.low is not None and self.high is not None:
            return f"in {self.low}…{self.high}"
        return f"≥ {self.low}" if self.low is not None else f"≤ {self.high}" if self.high is not None else ""

    def convert(self, value, param, ctx):
        flag = param.opts[0] if param else "the value"
        kind = "an integer" if self.type is int else "a number"
        if isinstance(value, str):
            try:
                value = self.type(value)
            except ValueError:
                raise InputError(f"{flag} must be {kind} {self.range()}, got {value!r}") from None
        if self.type is float and not math.isfinite(value):
            raise InputError(f"{flag} must be a finite number {self.range()}, got {value}")
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise InputError(f"{flag} must be {kind} {self.range()} (got {value})")
        return value


def check_folder(path: Path, option: str) -> None:
    """Refuse, before any work, an output folder that is a file or cannot be created or written."""
    if not str(path).strip():
        raise InputError(f"{option} is an empty path; give a folder")
    if path.exists() and not path.is_dir():
        raise InputError(f"{option} {path} is a file, not a folder; give a folder (it is created if missing)")
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise InputError(f"{option} {path}: cannot create a folder there ({existing} is a file)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"{option} {path}: cannot {'write' if existing == path else 'create'} there "
                         f"(permission denied in {existing})")


def engine_options(f):
    """``--engine local|ray`` and the Ray cluster's options (``explain-dataset``, ``evaluate``, ``tune``)."""
    for decorator in reversed([
        click.option("--engine", "engine_name", type=click.Choice(ENGINES.names()), default="local", show_default=True,
                     help="where the examples run: this process, or Ray workers (pip install 'rulegraph[ray]')"),
        click.option("--address", default=None, metavar="ADDRESS",
                     help="ray: an existing cluster (auto, ray://host:10001, …); default: a local cluster of "
                          "--num-workers workers, started for this run"),
        click.option("--num-workers", type=Bounded(int, 1, 4096), default=2, show_default=True,
                     help="ray: workers (actors), each with its own loaded model (1…4096)"),
        click.option("--cpus-per-worker", type=Bounded(int, 1, 1024), default=1, show_default=True,
                     help="ray: CPUs (torch threads) per worker (1…1024)"),
        click.option("--gpus-per-worker", type=Bounded(float, 0, 64), default=0, show_default=True,
                     help="ray: GPUs per worker (0…64; fractions share a GPU); use with --device cuda"),
    ]):
        f = decorator(f)
    return f


def make_engine(engine_name: str, address, num_workers: int, cpus_per_worker: int, gpus_per_worker: float):
    """The engine the options describe (Ray options given with ``--engine local`` are an error)."""
    from ..scale import engine
    if engine_name == "local":
        ctx = click.get_current_context()
        given = [p for p in ("address", "num_workers", "cpus_per_worker", "gpus_per_worker")
                 if ctx.get_parameter_source(p) not in (click.core.ParameterSource.DEFAULT, None)]
        if given:
            raise InputError(f"--{given[0].replace('_', '-')} is an option of --engine ray")
        return engine("local")
    return engine("ray", address=address, num_workers=num_workers, cpus_per_worker=cpus_per_worker,
                  gpus_per_worker=gpus_per_worker)


def region_objective(opts: dict[str, Any]) -> None:
    """``--region`` moved into ``opts["objective"]`` as the objective it stands for (both given: refused)."""
    text = opts.pop("region", None)
    if text is None:
        return
    if opts.get("objective") is not None:
        raise InputError("give --region or --objective, not both (a region is an objective: region[Y0:Y1, X0:X1])")
    from ..objective import region
    opts["objective"] = region(text)
