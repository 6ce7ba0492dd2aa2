"""Declared options: the knobs a method, a pass or a metric takes, each declared once with its
type, default, valid choices or range, and help.

The API checks a value against its declaration (:meth:`Option.parse`), the command line makes a
flag of it (:attr:`Option.flag`), ``rulegraph methods`` lists it. A pass's options are declared
here (:data:`PASS_OPTIONS`) rather than in ``passes/``, so that the command line reads them
without importing torch; the pass, the methods that run it (every rule set with that ``pass:``)
and the command line all read this one declaration.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import InputError, choices as valid


@dataclass(frozen=True)
class Option:
    """A declared option. ``type``: a type or a tuple of types (a string given for another type
    is converted with the first); ``choices``: the valid values, if a closed set; ``low`` /
    ``high``: the valid range (inclusive); ``default`` ``None``: unset unless given (e.g. "the
    rule file's value"); ``cli``: shown on the command line (``False``: the Python API only);
    ``attr``: the attribute it sets where that differs from ``name`` (a metric's field)."""

    name: str
    type: type | tuple[type, ...]
    default: Any
    help: str = ""
    choices: tuple = ()
    low: float | None = None
    high: float | None = None
    cli: bool = True
    attr: str = ""
    metavar: str = ""          # what the command line shows for its value (default: the choices, or the type)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def attribute(self) -> str:
        return self.attr or self.name

    @property
    def types(self) -> tuple[type, ...]:
        return self.type if isinstance(self.type, tuple) else (self.type,)

    def type_name(self) -> str:
        return " or ".join(t.__name__ for t in self.types)

    def range(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{self.low}…{self.high}"
        return f"≥ {self.low}" if self.low is not None else f"≤ {self.high}" if self.high is not None else "any"

    def parse(self, value: Any, what: str | None = None) -> Any:
        """``value`` converted and checked, or an :class:`InputError` naming ``what`` (default the flag)."""
        what = what or self.flag
        if value is None and self.default is None:          # unset by default, and not given
            return None
        types = self.types
        if isinstance(value, str) and str not in types:
            try:
                value = _boolean(value) if types[0] is bool else types[0](value)
            except ValueError:
                raise InputError(f"{what} must be {self.type_name()}, got {value!r}") from None
        if float in types and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, types) or isinstance(value, bool) != (bool in types):
            raise InputError(f"{what} must be {self.type_name()}, got {value!r}")
        if self.choices and value not in self.choices:
            raise InputError(f"{what}: {value!r} is not valid; {valid([str(c) for c in self.choices], str(value))}")
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise InputError(f"{what} must be in {self.range()} (got {value})")
        return value


def _boolean(text: str) -> bool:
    """A flag's value written as text (``-o attnlrp.graph=false``): ``bool("false")`` would be true."""
    words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
    if text.strip().lower() not in words:
        raise ValueError(text)
    return words[text.strip().lower()]


def resolve(declared: tuple[Option, ...], given: dict[str, Any], owner: str, noun: str = "method") -> dict[str, Any]:
    """``given`` checked against ``declared`` (an unknown name is an error naming the valid ones),
    every declared option filled in: the value given, else its default. ``noun`` and ``owner``
    name what takes them in messages (``method 'ig' has no option …``, ``option ig.steps must …``)."""
    names = {o.name: o for o in declared}
    unknown = [k for k in given if k not in names]
    if unknown:
        hint = valid(list(names), unknown[0]) if names else "it takes no options"
        raise InputError(f"{noun} {owner!r} has no option {unknown[0]!r}; {hint}")
    return {name: o.parse(given[name], f"option {owner}.{name}") if name in given else o.default
            for name, o in names.items()}


#: the precisions a run computes in, by torch dtype name (the half precisions where the device has them;
#: docs/precision.md); :data:`rulegraph.interpreter.DTYPES` maps them to dtypes
DTYPE_NAMES = ("float32", "float64", "bfloat16", "float16")

#: options of every rule set, whatever its pass: what its scores explain (``rulegraph evaluate -o
#: NAME.score=logprob``); :func:`rulegraph.explain`'s ``score=`` / ``contrast=`` take precedence where given
#: ``logits=``: the last layers at the positions explained only (the default: a causal language model's head,
#: a classifier's layers after its pooled position), or at every one
LOGITS = ("explained", "all")

RULE_SET_OPTIONS: tuple[Option, ...] = (
    Option("score", str, "logit", "explain the logit, or the log-probability (z_A − Σ p·z, p held constant); "
           "probability: a final Softmax's output itself, not its logits", ("logit", "logprob", "probability")),
    Option("contrast", str, None, "runner-up: explain z_A − z_B, B the highest other class (= log p_A − log p_B)",
           ("runner-up",)),
    Option("logits", str, LOGITS[0], "the last layers at the positions explained only — a causal language model's "
           "vocabulary projection (e.output_tensor holds those rows, e.rows names them), a classifier's layers "
           "after the position its head reads — or at every position", LOGITS, cli=False),
    Option("replay", bool, False, "the forward and the relevance walk traced once per input shape and replayed "
           "(on a CUDA device as CUDA graphs: the host's work per node done once; rulegraph.passes.replay)",
           cli=False),
    Option("compiled", bool, False, "replayed, on a CPU, with the traced forward and walk compiled by TorchInductor "
           "once per input shape (half a minute or more the first time; rulegraph.passes.replay): for many inputs "
           "of one shape", cli=False),
)

#: the relevance pass's options that read values inside the model, every position of them (recorded, selected,
#: conditioned, drawn): a replay carries none out, and a graph computing its last layers at the pooled position
#: only serves none
READS_INSIDE = ("record", "at", "condition", "graph")

#: the relevance pass's options reading inside the model (:mod:`rulegraph.inside`); what they ask is recorded in
#: the explanation itself (``e.inside``, ``e.extra["condition"]``), not among its options
INSIDE_OPTIONS: tuple[Option, ...] = (
    Option("at", (str, list), None, "the relevance at the values a selector picks, per position and unit "
           "(heads split out): 'block 1 attention output', 'every MLP activation', 'op Softmax' "
           "(docs/inside.md)", metavar="SELECTOR"),
    Option("condition", (str, list), None, "conditional relevance (CRP): keep only the relevance through these "
           "units at the selected values, e.g. 'block 1 attention output:heads=0,2' (docs/inside.md)",
           metavar="SELECTOR:UNITS"),
    Option("graph", bool, False, "the relevance graph: per layer and position, and the attention's query → key "
           "messages (rulegraph.layergraph, docs/inside.md); the command line's --graph PATH writes it", cli=False),
)

#: pass name → its options (``explain(..., groups=…)``, ``--groups``, a rule set's method options)
PASS_OPTIONS: dict[str, tuple[Option, ...]] = {
    "relevance": (
        Option("record", (list, tuple), (), "the relevance at these graph values too (Explanation.recorded)",
               cli=False),
        *INSIDE_OPTIONS,
    ),
    "decomposition": (
        Option("groups", (str, list), "token", "the input partition: token, word, source:K (source vs target "
               "prefix), or position ranges such as 0-3,4-9", metavar="token|word|source:K|0-3,4-9"),
        Option("alpha", str, None, "α of the ReLU bias reallocation: signed (Eq. 13), abs (Eq. 12), hybrid "
               "(Eq. 17); default: the rule file's", ("signed", "abs", "hybrid")),
        Option("threshold", float, None, "λ of hybrid α (Eq. 17); default: the rule file's (0.1)", low=0.0, high=1.0),
        Option("variant", str, None, "hat (D̂, the bias reallocated) or bar (D̄, the bias kept as its own component); "
               "default: the rule file's", ("hat", "bar")),
        Option("mode", str, "auto", "components (every group carried through the graph), linearized (one group and "
               "a backward pass: signed α or D̄ only), auto (linearized where it applies)",
               ("auto", "components", "linearized")),
        Option("word_ids", list, None, "per batch item, each token's word index (groups=word; filled from the text)",
               cli=False),
        Option("tokens", list, None, "per batch item, the token texts labelling the groups (filled from the text)",
               cli=False),
    ),
}
