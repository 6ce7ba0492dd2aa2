"""Options shared by the commands. Only light modules are imported here, so ``--help`` is fast."""
from __future__ import annotations

from pathlib import Path

import click

from ..errors import InputError
from ..image import IMAGENET_MEAN, IMAGENET_STD
from ..rulesets import shipped_rule_sets

#: the precisions a run can use (torch dtypes by name)
DTYPES = ("float32", "float64")


class OutputPath(click.ParamType):
    """A file to write (``-``: standard output); an empty value is refused, not read as ``.``."""

    name = "path"

    def convert(self, value, param, ctx):
        if isinstance(value, Path):
            return value
        if not str(value).strip():
            raise InputError(f"{param.opts[0] if param else 'the output'} is an empty path; give a file name, "
                             "or '-' for standard output")
        return Path(value)


OUTPUT = OutputPath()


def model_argument(f):
    return click.argument("model", type=click.Path(dir_okay=True, path_type=Path))(f)


def rules_option(f):
    names = ", ".join(shipped_rule_sets(None))
    return click.option("--rules", "-r", required=True, metavar="NAME|PATH",
                        help=f"a shipped rule set ({names}) or a YAML rule file")(f)


def method_options(f):
    """``explain``: a rule set (--rules) or any method (--method: baselines too), with -o options."""
    names = ", ".join(shipped_rule_sets(None))
    for decorator in reversed([
        click.option("--rules", "-r", metavar="NAME|PATH", help=f"a shipped rule set ({names}) or a YAML rule file"),
        click.option("--method", "-m", metavar="NAME",
                     help="instead of --rules: any method of `rulegraph methods` — a rule set, or a baseline "
                          "(random, gs, ig, loo, attention, rollout)"),
        click.option("--option", "-o", "method_option", multiple=True, metavar="KEY=VALUE",
                     help="an option of the --method, e.g. -o steps=50 for ig (repeatable)"),
    ]):
        f = decorator(f)
    return f


def input_options(f):
    for decorator in reversed([
        click.option("--text", "-t", "texts", multiple=True, metavar="TEXT",
                     help="text to explain (repeatable; each is explained on its own)"),
        click.option("--tokenizer", type=click.Path(exists=False, path_type=Path), metavar="PATH",
                     help="tokenizer.json (default: the one next to the model)"),
        click.option("--input", "-i", "raw_inputs", multiple=True, metavar="NAME=V1,V2,…|NAME=FILE.npy",
                     help="a model input as comma-separated values (one row) or a .npy file (repeatable)"),
        click.option("--target", type=int, default=None, help="class index to explain (default: the argmax)"),
        click.option("--position", type=int, default=None,
                     help="for [batch, positions, classes] outputs: the position explained (default: last)"),
        click.option("--output", "output_name", default=None, help="graph output to explain (default: the first)"),
        click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True),
        click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True),
    ]):
        f = decorator(f)
    return f


def image_options(f):
    """``explain --image``: preprocessing (see rulegraph.image) and the heatmap PNG."""
    floats = click.Tuple([float, float, float])
    for decorator in reversed([
        click.option("--image", "image_path", type=click.Path(path_type=Path), metavar="PATH",
                     help="an image for a vision model: resized, center-cropped, normalised (see --size, --mean)"),
        click.option("--png", "png_path", type=OUTPUT, metavar="OUT",
                     help="write the pixel heatmap as a PNG (default with --image and --html: beside the page)"),
        click.option("--size", "image_size", type=click.IntRange(min=1), default=224, show_default=True,
                     help="center-crop size"),
        click.option("--resize", "image_resize", type=click.IntRange(min=1), default=256, show_default=True,
                     help="shorter side before the crop"),
        click.option("--mean", "image_mean", type=floats, default=IMAGENET_MEAN, show_default=True,
                     help="per-channel mean subtracted (R G B)"),
        click.option("--std", "image_std", type=floats, default=IMAGENET_STD, show_default=True,
                     help="per-channel std divided by (R G B)"),
    ]):
        f = decorator(f)
    return f
