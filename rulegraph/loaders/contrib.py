"""onnxruntime's fused and n-bit operators (domain ``com.microsoft``) → the standard ONNX subgraphs they stand for.

onnxruntime's transformer optimizer (``onnxruntime.transformers.optimizer.optimize_model``) fuses the
subgraphs of an export into contrib operators, and its n-bit quantizer (``MatMulNBitsQuantizer``) stores
a MatMul's weights as 4-bit blocks. The loader expands each such node, once, into the ordinary nodes it
computes (:func:`expand`), so every rule set and every pass sees one convention: an attention's
``Softmax → MatMul`` is the attention probabilities of :data:`rulegraph.patterns.PROBABILITIES`, a
``SkipLayerNormalization`` is an ``Add`` and a ``LayerNormalization`` (the LN rule), a ``BiasGelu`` is
``x · ½(1 + erf(x/√2))`` (the gate of the rule sets' GELU entries), and a ``MatMulNBits`` is a
``MatMul`` by its dequantized weights (a float constant, as the ``quantization`` canonizer folds a
``DequantizeLinear`` of constants: the dequantized weights *are* the layer's weights for every rule).

Each expansion follows onnxruntime's definition of the op (its contrib-op documentation and CPU kernels)
and is ordered as the PyTorch exports of the unfused modules are (Hugging Face BERT, GPT-2), so that a
fused graph explains as the unfused export does. A variant that is not expanded (an attention with a
past key/value cache, a 4-D mask, packed query/key/value inputs…) is
refused at load with a one-line error naming the node, the op and the attribute or input, rather than
computed differently. The expanded nodes are named ``<fused node>/<part>`` and carry the fused node's
scope (its name's, else its outputs' or its weights'), so the audit's layers stay what they were.
"""
from __future__ import annotations

import math
import re
from typing import Callable

import torch

from ..errors import ModelError
from ..ir import Node
from ..registry import Registry

#: onnxruntime's contrib-op domain
DOMAIN = "com.microsoft"

#: op type → expansion; each takes an :class:`Expansion` and adds the nodes the op stands for
EXPANSIONS: Registry[Callable[["Expansion"], None]] = Registry("contrib op expansion", ModelError)


#: register the expansion of a contrib op: ``@expansion("SkipLayerNormalization")``
expansion = EXPANSIONS.register


def expands(domain: str, op_type: str) -> bool:
    """Whether :func:`expand` rewrites a node of this domain and op type (or refuses its variant)."""
    return domain == DOMAIN and op_type in EXPANSIONS


class Shapes:
    """The shapes of a graph's values, found by ``infer`` when an expansion first needs one (a rank,
    a hidden size), and those the expansions know of their own outputs (``known``)."""

    def __init__(self, infer: Callable[[], dict[str, tuple]]):
        self._infer = infer
        self._found: dict[str, tuple] | None = None
        self.known: dict[str, tuple] = {}

    def get(self, value: str) -> tuple | None:
        if value in self.known:
            return self.known[value]
        if self._found is None:
            self._found = self._infer()
        return self._found.get(value)


def expand(name: str, op_type: str, inputs: tuple[str, ...], outputs: tuple[str, ...], attrs: dict,
           scope: str, constants: dict[str, torch.Tensor], shapes: Shapes) -> list[Node]:
    """The standard nodes the contrib node ``name`` computes. New constants (weights sliced or
    dequantized once) are added to ``constants``; ``shapes`` are read where an expansion depends
    on a rank or a hidden size."""
    e = Expansion(name, op_type, inputs, outputs, attrs, scope or _scope(name, inputs, outputs), constants, shapes)
    EXPANSIONS.get(op_type)(e)
    return e.nodes


class Expansion:
    """One contrib node being expanded: its inputs (``""`` where omitted), outputs and attributes,
    and the nodes and constants it becomes."""

    def __init__(self, name, op_type, inputs, outputs, attrs, scope, constants, shapes):
        self.name, self.op_type, self.attrs, self.scope, self.constants = name, op_type, attrs, scope, constants
        self.shapes = shapes
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.nodes: list[Node] = []
        self._parts: dict[str, int] = {}

    # -- reading the fused node ------------------------------------------------------------------
    def input(self, k: int) -> str:
        return self.inputs[k] if k < len(self.inputs) else ""

    def output(self, k: int) -> str:
        return self.outputs[k] if k < len(self.outputs) else ""

    def refuse(self, what: str, why: str) -> None:
        raise ModelError(f"node {self.name!r} ({self.op_type}, domain {DOMAIN}): {what} {why}; "
                         "rulegraph expands the variants listed in docs/deployed.md")

    def no_input(self, k: int, what: str) -> None:
        if self.input(k):
            self.refuse(f"input {k} ({what})", "is not expanded")

    def no_output(self, k: int, what: str) -> None:
        if self.output(k):
            self.refuse(f"output {k} ({what})", "is not expanded")

    def shape(self, value: str, what: str) -> tuple:
        """The shape of ``value``: an initializer's, else the one the graph declares."""
        if value in self.constants:
            return tuple(self.constants[value].shape)
        shape = self.shapes.get(value)
        if shape is None:
            self.refuse(f"the {what} {value!r}", "has no declared shape (run onnx shape inference on the model)")
        return shape

    def required(self, attr: str) -> int:
        """The integer attribute ``attr``, which the op requires."""
        if attr not in self.attrs:
            self.refuse(f"attribute {attr}", "is missing")
        return int(self.attrs[attr])

    def constant(self, k: int, what: str) -> torch.Tensor:
        value = self.constants.get(self.input(k))
        if value is None:
            self.refuse(f"input {k} ({what})", "is not an initializer")
        return value

    # -- writing the expansion -------------------------------------------------------------------
    def _part(self, part: str) -> str:
        k = self._parts.get(part, 0)
        self._parts[part] = k + 1
        return f"{self.name}/{part}" + (f"_{k}" if k else "")

    def const(self, part: str, value) -> str:
        name = f"{self._part(part)}:value"
        self.constants[name] = value if isinstance(value, torch.Tensor) else torch.tensor(value)
        return name

    def add(self, op: str, part: str, *inputs: str, out: str | tuple[str, ...] = "", n: int = 1, **attrs) -> str:
        """Add node ``op`` named ``<fused>/<part>``; its outputs are ``out`` (the fused node's own
        output names where the expansion ends) or new names. Returns its first output."""
        name = self._part(part)
        outs = (out,) if isinstance(out, str) else tuple(out)
        if outs == ("",):
            outs = tuple(f"{name}:{k}" for k in range(n))
        self.nodes.append(Node(name, op, tuple(inputs), outs, attrs, "", self.scope))
        return outs[0]

    def ints(self, part: str, *values: int) -> str:
        return self.const(part, torch.tensor(values, dtype=torch.int64))


def _scope(name: str, inputs, outputs) -> str:
    """The module scope of a fused node: from its name (``/bert/encoder/layer.0/…``), else from the
    first output named after an exported module, else from the first weight named after a module
    parameter (``bert.embeddings.word_embeddings.weight`` → ``bert.embeddings.word_embeddings``)."""
    for label in (name, *outputs):
        if label.startswith("/") and "/" in label[1:]:
            return ".".join(label.strip("/").split("/")[:-1])
    for label in inputs:
        if re.fullmatch(r"[\w.]+\.(weight|bias)", label):
            return label.rsplit(".", 1)[0]
    return ""


# -- GELU -----------------------------------------------------------------------------------------

def _erf_gelu(e: Expansion, x: str, out: str) -> None:
    """``x · ½(1 + erf(x/√2))`` as PyTorch exports ``gelu``: Div → Erf → Add → Mul(x, ·) → Mul(·, ½)."""
    t = e.add("Div", "Div", x, e.const("sqrt2", math.sqrt(2.0)))
    t = e.add("Erf", "Erf", t)
    t = e.add("Add", "Add", t, e.const("one", 1.0))
    t = e.add("Mul", "Mul", x, t)
    e.add("Mul", "Mul", t, e.const("half", 0.5), out=out)


def _tanh_gelu(e: Expansion, x: str, out: str) -> None:
    """``½x · (1 + tanh(√(2/π)(x + 0.044715x³)))`` as GPT-2's ``NewGELUActivation`` exports."""
    half = e.add("Mul", "Mul", x, e.const("half", 0.5))
    t = e.add("Pow", "Pow", x, e.const("three", 3.0))
    t = e.add("Mul", "Mul", t, e.const("coefficient", 0.044715))
    t = e.add("Add", "Add", x, t)
    t = e.add("Mul", "Mul", t, e.const("sqrt_2_over_pi", math.sqrt(2.0 / math.pi)))
    t = e.add("Tanh", "Tanh", t)
    t = e.add("Add", "Add", t, e.const("one", 1.0))
    e.add("Mul", "Mul", half, t, out=out)


def _biased(e: Expansion) -> str:
    """The input plus the optional bias (input 1), added as a Linear's export adds its bias."""
    return e.add("Add", "bias", e.input(1), e.input(0)) if e.input(1) else e.input(0)


@expansion("Gelu")
def _gelu(e: Expansion) -> None:
    """onnxruntime ``Gelu``: the exact (erf) GELU (Hendrycks & Gimpel 2016, "Gaussian error linear units")."""
    _erf_gelu(e, e.input(0), e.output(0))


@expansion("BiasGelu")
def _bias_gelu(e: Expansion) -> None:
    """onnxruntime ``BiasGelu``: ``Gelu(A + B)``, ``B`` the bias over the last axis."""
    _erf_gelu(e, _biased(e), e.output(0))


@expansion("FastGelu")
def _fast_gelu(e: Expansion) -> None:
    """onnxruntime ``FastGelu``: the tanh approximation of GELU, of ``X`` (+ the optional ``bias``)."""
    _tanh_gelu(e, _biased(e), e.output(0))


# -- layer normalizations -------------------------------------------------------------------------

def _skip_sum(e: Expansion, bias_input: int) -> str:
    """``input (+ bias) + skip``, as an unfused block adds its sublayer's bias, then the residual;
    named as the fused node's ``input_skip_bias_sum`` output where the graph reads it."""
    x = e.add("Add", "bias", e.input(bias_input), e.input(0)) if e.input(bias_input) else e.input(0)
    return e.add("Add", "Add", x, e.input(1), out=e.output(3))


@expansion("SkipLayerNormalization")
def _skip_layer_norm(e: Expansion) -> None:
    """onnxruntime ``SkipLayerNormalization``: ``LayerNorm(input + skip + bias)·gamma + beta``
    (Ba, Kiros & Hinton 2016, "Layer normalization"); outputs the normalised sum, and optionally the
    mean, the inverse standard deviation and the sum itself."""
    s = _skip_sum(e, 4)
    gamma_beta = (e.input(2), e.input(3)) if e.input(3) else (e.input(2),)
    e.add("LayerNormalization", "LayerNormalization", s, *gamma_beta, out=(e.output(0), e.output(1), e.output(2)),
          axis=-1, epsilon=float(e.attrs.get("epsilon", 1e-12)))


@expansion("SkipSimplifiedLayerNormalization")
def _skip_simplified_layer_norm(e: Expansion) -> None:
    """onnxruntime ``SkipSimplifiedLayerNormalization``: RMSNorm (Zhang & Sennrich 2019, "Root mean
    square layer normalization", NeurIPS) of ``input + skip + bias``, and optionally that sum."""
    e.no_output(1, "mean")
    e.no_output(2, "inv_std_var")
    s = _skip_sum(e, 3)
    e.add("SimplifiedLayerNormalization", "SimplifiedLayerNormalization", s, e.input(2), out=e.output(0),
          axis=-1, epsilon=float(e.attrs.get("epsilon", 1e-12)))


@expansion("EmbedLayerNormalization")
def _embed_layer_norm(e: Expansion) -> None:
    """onnxruntime ``EmbedLayerNormalization``: ``LayerNorm(word[ids] + segment[segment_ids] +
    position[positions])`` (positions ``0…S−1`` unless ``position_ids`` is given), summed as
    BERT's embeddings sum them; ``mask_index`` is the number of ones in each row of ``mask``
    (zeros without a mask), as onnxruntime's CPU kernel computes it."""
    ids = e.input(0)
    x = e.add("Gather", "word_embeddings", e.input(2), ids, axis=0)
    if e.input(1) and e.input(4):
        x = e.add("Add", "Add", x, e.add("Gather", "token_type_embeddings", e.input(4), e.input(1), axis=0))
    positions = e.input(8)
    if not positions:
        length = e.add("Gather", "length", e.add("Shape", "Shape", ids), e.const("one", torch.tensor(1)), axis=0)
        positions = e.add("Range", "positions", e.const("zero", torch.tensor(0)), length, e.const("step", torch.tensor(1)))
        positions = e.add("Unsqueeze", "position_ids", positions, e.ints("axis", 0))
    x = e.add("Add", "Add", x, e.add("Gather", "position_embeddings", e.input(3), positions, axis=0), out=e.output(2))
    e.add("LayerNormalization", "LayerNormalization", x, e.input(5), e.input(6), out=e.output(0), axis=-1,
          epsilon=float(e.attrs.get("epsilon", 1e-12)))
    if e.output(1):
        e.shapes.known[e.output(1)] = (None,)
        if e.input(7):
            ones = e.add("Equal", "Equal", e.input(7), e.const("mask_one", torch.tensor(1, dtype=torch.int32)))
            ones = e.add("Cast", "Cast", ones, to=torch.int32)
            e.add("ReduceSum", "mask_index", ones, e.ints("axes", 1), out=e.output(1), keepdims=0)
        else:
            batch = e.add("Slice", "batch", e.add("Shape", "Shape", ids), e.ints("start", 0), e.ints("end", 1))
            e.add("ConstantOfShape", "mask_index", batch, out=e.output(1), value=torch.zeros(1, dtype=torch.int32))


# -- attention ------------------------------------------------------------------------------------

def _heads(e: Expansion, x: str, heads: int, size: int, part: str, perm: list[int]) -> str:
    """``[B, S, heads·size]`` → ``[B, heads, S, size]`` (or ``[B, heads, size, S]`` for the keys)."""
    t = e.add("Reshape", f"{part}/Reshape", x, e.ints("shape", 0, 0, heads, size))
    return e.add("Transpose", f"{part}/Transpose", t, perm=perm)


def _keep(e: Expansion, mask: str, key_length: str, what: str) -> str:
    """A boolean ``keep`` mask broadcasting on the scores ``[B, N, S, T]`` from onnxruntime's
    ``mask_index`` formats: 1-D ``[B]`` (keys at or after each end position masked: right padding),
    1-D ``[2B]`` (ends, then starts: keys before the start masked too), 2-D ``[B, T]`` and 3-D
    ``[B, S, T]`` (raw masks: a key is kept where the mask is positive)."""
    rank = len(e.shape(mask, what))
    if rank in (2, 3):
        keep = e.add("Greater", "mask/Greater", mask, e.const("mask/zero", torch.tensor(0, dtype=torch.int32)))
        return e.add("Unsqueeze", "mask/Unsqueeze", keep, e.ints("mask/axes", *((1, 2) if rank == 2 else (1,))))
    if rank != 1:
        e.refuse(f"the {rank}-D {what}", "is not expanded (1-D, 2-D and 3-D masks are)")
    keys = e.add("Range", "mask/keys", e.const("mask/start", torch.tensor(0)), key_length,
                 e.const("mask/step", torch.tensor(1)))
    positions = e.add("Cast", "mask/Cast", mask, to=torch.int64)
    batch = e.add("Slice", "mask/batch", e.add("Shape", "mask/Shape", e.input(0)), e.ints("mask/0", 0), e.ints("mask/1", 1))
    ends = e.add("Slice", "mask/ends", positions, e.ints("mask/0", 0), batch)
    keep = e.add("Less", "mask/Less", keys, e.add("Unsqueeze", "mask/ends_column", ends, e.ints("mask/a1", 1)))
    # the starts: entries B…2B−1 of the index padded with B zeros (a [B] index masks nothing before)
    zeros = e.add("ConstantOfShape", "mask/no_starts", batch, value=torch.zeros(1, dtype=torch.int64))
    padded = e.add("Concat", "mask/padded", positions, zeros, axis=0)
    starts = e.add("Slice", "mask/starts", padded, batch, e.add("Mul", "mask/2B", batch, e.ints("mask/2", 2)))
    before = e.add("Less", "mask/before", keys, e.add("Unsqueeze", "mask/starts_column", starts, e.ints("mask/a1", 1)))
    keep = e.add("And", "mask/And", keep, e.add("Not", "mask/Not", before))
    return e.add("Unsqueeze", "mask/Unsqueeze", keep, e.ints("mask/axes", 1, 2))


def _causal(e: Expansion, length: str) -> str:
    """``keep[s, t] = t ≤ s``: the unidirectional (causal) mask of a GPT-2 style attention."""
    keys = e.add("Range", "causal/keys", e.const("causal/start", torch.tensor(0)), length,
                 e.const("causal/step", torch.tensor(1)))
    queries = e.add("Unsqueeze", "causal/queries", keys, e.ints("causal/axis", 1))
    return e.add("LessOrEqual", "causal/LessOrEqual", keys, queries)


def _attend(e: Expansion, q: str, kt: str, v: str, head_size: int, keep: str | None, causal: str | None, bias: str,
            out: str, heads: int, v_size: int) -> None:
    """``softmax(q·kᵀ·scale + mask + bias)·v`` per head (Vaswani et al. 2017, "Attention is all you
    need", NeurIPS), heads joined back into ``[B, S, heads·v_size]``. As in onnxruntime's kernels the
    mask adds ``mask_filter_value`` where ``keep`` is false, and the lowest float where ``causal`` is
    (a row whose keys are all padding then still attends by its scores; a causal row never looks ahead)."""
    scale = float(e.attrs.get("scale", 0.0)) or 1.0 / math.sqrt(head_size)
    scores = e.add("MatMul", "MatMul", q, kt)
    scores = e.add("Mul", "Mul", scores, e.const("scale", scale))
    mask = None
    if keep is not None:
        mask = e.add("Where", "mask/Where", keep, e.const("mask/kept", 0.0),
                     e.const("mask/filter", float(e.attrs.get("mask_filter_value", -10000.0))))
    if causal is not None:
        mask = e.add("Where", "causal/Where", causal, mask or e.const("causal/kept", 0.0),
                     e.const("causal/lowest", torch.finfo(torch.float32).min))
    if mask is not None:
        scores = e.add("Add", "Add", scores, mask)
    if bias:
        scores = e.add("Add", "Add", scores, bias)
    p = e.add("Softmax", "Softmax", scores, axis=-1)
    t = e.add("MatMul", "MatMul", p, v)
    t = e.add("Transpose", "Transpose", t, perm=[0, 2, 1, 3])
    e.add("Reshape", "Reshape", t, e.ints("shape", 0, 0, heads * v_size), out=out)


def _length(e: Expansion, x: str, axis: int, part: str) -> str:
    return e.add("Gather", f"{part}/length", e.add("Shape", f"{part}/Shape", x), e.const(f"{part}/axis", torch.tensor(axis)),
                 axis=0)


@expansion("Attention")
def _attention(e: Expansion) -> None:
    """onnxruntime ``Attention``: self-attention of ``input`` with the packed weights ``[D, Dq+Dk+Dv]``
    (``qkv_hidden_sizes``, equal thirds by default) and bias, ``num_heads`` heads, ``scale`` (default
    1/√head size), an optional ``mask_index`` (see :func:`_keep`), ``unidirectional`` (causal) and an
    additive ``attention_bias``. Expanded as three projections ``MatMul + Add``, as an unfused
    export computes them. Past/present key–value caches and rotary embeddings are refused."""
    e.no_input(4, "past")
    e.no_input(6, "past_sequence_length")
    e.no_output(1, "present")
    for attr in ("do_rotary", "past_present_share_buffer"):
        if e.attrs.get(attr, 0):
            e.refuse(f"attribute {attr}={e.attrs[attr]}", "is not expanded")
    heads = e.required("num_heads")
    w = e.constant(1, "weights")
    b = e.constant(2, "bias") if e.input(2) else None
    sizes = list(e.attrs.get("qkv_hidden_sizes") or [w.shape[1] // 3] * 3)
    if sum(sizes) != w.shape[1] or any(s % heads for s in sizes) or sizes[0] != sizes[1]:
        e.refuse(f"attribute qkv_hidden_sizes={sizes}", f"does not fit weights of shape {list(w.shape)} and {heads} heads")
    x = e.input(0)
    projected = []
    start = 0
    for part, size in zip(("query", "key", "value"), sizes):
        t = e.add("MatMul", f"{part}/MatMul", x, e.const(f"{part}/weight", w[:, start:start + size].contiguous()))
        if b is not None:
            t = e.add("Add", f"{part}/Add", e.const(f"{part}/bias", b[start:start + size].contiguous()), t)
        projected.append(t)
        start += size
    q = _heads(e, projected[0], heads, sizes[0] // heads, "query", [0, 2, 1, 3])
    kt = _heads(e, projected[1], heads, sizes[1] // heads, "key", [0, 2, 3, 1])
    v = _heads(e, projected[2], heads, sizes[2] // heads, "value", [0, 2, 1, 3])
    length = _length(e, x, 1, "sequence")
    keep = _keep(e, e.input(3), length, "mask_index") if e.input(3) else None
    causal = _causal(e, length) if e.attrs.get("unidirectional", 0) else None
    _attend(e, q, kt, v, sizes[0] // heads, keep, causal, e.input(5), e.output(0), heads, sizes[2] // heads)


@expansion("MultiHeadAttention")
def _multi_head_attention(e: Expansion) -> None:
    """onnxruntime ``MultiHeadAttention`` with separate ``query [B, S, D]``, ``key [B, L, D]`` and
    ``value [B, L, Dv]`` (already projected), the optional packed ``bias [D + D + Dv]``, a
    ``key_padding_mask`` (1-D or 2-D, as :func:`_keep`), an additive ``attention_bias`` and
    ``unidirectional``. Packed query/key/value, 4-D key/value and past/present caches are refused."""
    for k, what in ((6, "past_key"), (7, "past_value"), (8, "past_sequence_length"), (9, "cache_indirection")):
        e.no_input(k, what)
    for k, what in ((1, "present_key"), (2, "present_value"), (3, "qk")):
        e.no_output(k, what)
    if not e.input(1) or not e.input(2):
        e.refuse("a packed query/key/value (key or value omitted)", "is not expanded")
    for k, what in ((0, "query"), (1, "key"), (2, "value")):
        if len(e.shape(e.input(k), what)) != 3:
            e.refuse(f"input {k} ({what}) of rank {len(e.shape(e.input(k), what))}", "is not expanded (rank 3 is)")
    heads = e.required("num_heads")
    q, k, v = e.input(0), e.input(1), e.input(2)
    if e.input(3):
        bias = e.constant(3, "bias")
        d, dv = _bias_sizes(e, bias.shape[0])
        q = e.add("Add", "query/Add", e.const("query/bias", bias[:d].contiguous()), q)    # as a Linear's export adds it
        k = e.add("Add", "key/Add", e.const("key/bias", bias[d:2 * d].contiguous()), k)
        v = e.add("Add", "value/Add", e.const("value/bias", bias[2 * d:].contiguous()), v)
    d, dv = _hidden(e, 0), _hidden(e, 2)
    if d % heads or dv % heads:
        e.refuse(f"attribute num_heads={heads}", f"does not divide the hidden sizes {d} and {dv}")
    qh = _heads(e, q, heads, d // heads, "query", [0, 2, 1, 3])
    kt = _heads(e, k, heads, d // heads, "key", [0, 2, 3, 1])
    vh = _heads(e, v, heads, dv // heads, "value", [0, 2, 1, 3])
    keep = _keep(e, e.input(4), _length(e, k, 1, "keys"), "key_padding_mask") if e.input(4) else None
    causal = _causal(e, _length(e, q, 1, "sequence")) if e.attrs.get("unidirectional", 0) else None
    _attend(e, qh, kt, vh, d // heads, keep, causal, e.input(5), e.output(0), heads, dv // heads)


def _hidden(e: Expansion, k: int) -> int:
    """The last dimension of input ``k``, as the graph declares it."""
    size = e.shape(e.input(k), f"input {k}")[-1]
    if not isinstance(size, int) or size <= 0:
        e.refuse(f"input {k}", "has no fixed last dimension in the graph's shapes")
    return size


def _bias_sizes(e: Expansion, total: int) -> tuple[int, int]:
    d, dv = _hidden(e, 0), _hidden(e, 2)
    if 2 * d + dv != total:
        e.refuse(f"input 3 (bias) of size {total}", f"does not fit query/key size {d} and value size {dv}")
    return d, dv


@expansion("GroupQueryAttention")
def _group_query_attention(e: Expansion) -> None:
    """onnxruntime ``GroupQueryAttention`` without a key/value cache (Ainslie et al. 2023, "GQA",
    EMNLP): ``num_heads`` query heads share ``kv_num_heads`` key/value heads (each repeated, as
    Hugging Face's ``repeat_kv`` exports it); always causal, and key ``t`` of item ``b`` is masked
    past ``seqlens_k[b]`` (its last valid position: right padding); ``present_key`` /
    ``present_value`` are the keys and values by head. Past inputs, packed query/key/value, rotary
    embeddings, a local window, soft-capping, smooth softmax and attention bias or sinks are refused."""
    for k, what in ((3, "past_key"), (4, "past_value"), (7, "cos_cache"), (8, "sin_cache"), (9, "position_ids"),
                    (10, "attention_bias"), (11, "head_sink")):
        e.no_input(k, what)
    e.no_output(3, "output_qk")
    if not e.input(1) or not e.input(2):
        e.refuse("a packed query/key/value (key or value omitted)", "is not expanded")
    for attr, default in (("do_rotary", 0), ("local_window_size", -1), ("softcap", 0.0), ("smooth_softmax", 0)):
        if e.attrs.get(attr, default) != default:
            e.refuse(f"attribute {attr}={e.attrs[attr]}", f"is not expanded ({default} is)")
    heads, kv_heads = e.required("num_heads"), e.required("kv_num_heads")
    size = _hidden(e, 0) // heads
    if heads % kv_heads or _hidden(e, 1) != kv_heads * size:
        e.refuse(f"attributes num_heads={heads}, kv_num_heads={kv_heads}", "do not fit the query and key sizes")
    q = _heads(e, e.input(0), heads, size, "query", [0, 2, 1, 3])
    grouped = []
    for k, part in ((1, "key"), (2, "value")):
        t = e.add("Reshape", f"{part}/Reshape", e.input(k), e.ints(f"{part}/shape", 0, 0, kv_heads, size))
        t = e.add("Transpose", f"{part}/Transpose", t, perm=[0, 2, 1, 3], out=e.output(k))
        t = e.add("Unsqueeze", f"{part}/repeat", t, e.ints(f"{part}/axis", 2))
        t = e.add("Expand", f"{part}/Expand", t, e.ints(f"{part}/groups", 1, 1, heads // kv_heads, 1, 1))
        grouped.append(e.add("Reshape", f"{part}/heads", t, e.ints(f"{part}/shape", 0, heads, -1, size)))
    kt = e.add("Transpose", "key/Transpose", grouped[0], perm=[0, 1, 3, 2])
    length = _length(e, e.input(0), 1, "sequence")
    keys = e.add("Range", "mask/keys", e.const("mask/start", torch.tensor(0)), length, e.const("mask/step", torch.tensor(1)))
    last = e.add("Cast", "mask/Cast", e.input(5), to=torch.int64)
    valid = e.add("LessOrEqual", "mask/valid", keys, e.add("Unsqueeze", "mask/last", last, e.ints("mask/a1", 1)))
    valid = e.add("Unsqueeze", "mask/Unsqueeze", valid, e.ints("mask/axes", 1, 2))
    blocked = e.add("And", "mask/And", _causal(e, length), valid)
    _attend(e, q, kt, grouped[1], size, None, blocked, "", e.output(0), heads, size)


# -- rotary position embedding --------------------------------------------------------------------

@expansion("RotaryEmbedding")
def _rotary_embedding(e: Expansion) -> None:
    """onnxruntime ``RotaryEmbedding`` (Su et al. 2024, "RoFormer", Neurocomputing): rotates each head's
    first ``rotary_embedding_dim`` features (all by default) by the angles of ``cos_cache`` /
    ``sin_cache`` at ``position_ids`` (``[B, S]``, or one offset ``[1]``: positions offset…offset+S−1),
    halves (``interleaved=0``: ``x₁·cos − x₂·sin, x₂·cos + x₁·sin``) or pairs (``interleaved=1``).
    Input ``[B, S, N·H]`` (``num_heads`` given) or ``[B, N, S, H]``."""
    if e.attrs.get("is_packed_batching", 0):
        e.refuse("attribute is_packed_batching=1", "is not expanded")
    if float(e.attrs.get("scale", 1.0)) != 1.0:
        e.refuse(f"attribute scale={e.attrs['scale']}", "is not expanded (1.0 is)")
    rank = len(e.shape(e.input(0), "input"))
    x = e.input(0)
    heads = int(e.attrs.get("num_heads", 0))
    cos = e.constant(2, "cos_cache")
    half = cos.shape[-1]
    if rank == 3:
        if not heads:
            e.refuse("a 3-D input without attribute num_heads", "is not expanded")
        size = _hidden(e, 0) // heads
        x = e.add("Reshape", "heads", x, e.ints("heads/shape", 0, 0, heads, size))
        x = e.add("Transpose", "heads/Transpose", x, perm=[0, 2, 1, 3])
    elif rank != 4:
        e.refuse(f"a {rank}-D input", "is not expanded")
    else:
        size = _hidden(e, 0)
    rotary = int(e.attrs.get("rotary_embedding_dim", 0)) or size
    if rotary != 2 * half or rotary > size:
        e.refuse(f"rotary_embedding_dim={rotary}", f"does not fit caches of {half} angles and heads of size {size}")
    positions = e.input(1)
    if len(e.shape(positions, "position_ids")) == 1:           # one offset: positions offset … offset + S − 1
        length = _length(e, x, 2, "positions")
        steps = e.add("Range", "positions/Range", e.const("positions/zero", torch.tensor(0)), length,
                      e.const("positions/one", torch.tensor(1)))
        positions = e.add("Add", "positions/Add", e.add("Unsqueeze", "positions/row", steps, e.ints("positions/a", 0)),
                          e.add("Unsqueeze", "positions/offset", positions, e.ints("positions/b", 0)))
    # angles [B, S, half] → [B, 1, S, half]
    c = e.add("Unsqueeze", "cos/heads", e.add("Gather", "cos", e.input(2), positions, axis=0), e.ints("cos/a", 1))
    s = e.add("Unsqueeze", "sin/heads", e.add("Gather", "sin", e.input(3), positions, axis=0), e.ints("sin/a", 1))
    rotated = x if rotary == size else e.add("Slice", "rotated", x, e.ints("r/s", 0), e.ints("r/e", rotary), e.ints("r/ax", 3))
    if e.attrs.get("interleaved", 0):
        pairs = e.add("Reshape", "pairs", rotated, e.ints("pairs/shape", 0, 0, 0, half, 2))
        x1 = e.add("Reshape", "x1", e.add("Slice", "even", pairs, e.ints("p/0", 0), e.ints("p/1", 1), e.ints("p/ax", 4)),
                   e.ints("x1/shape", 0, 0, 0, half))
        x2 = e.add("Reshape", "x2", e.add("Slice", "odd", pairs, e.ints("p/1", 1), e.ints("p/2", 2), e.ints("p/ax", 4)),
                   e.ints("x2/shape", 0, 0, 0, half))
    else:
        x1 = e.add("Slice", "x1", rotated, e.ints("h/0", 0), e.ints("h/1", half), e.ints("h/ax", 3))
        x2 = e.add("Slice", "x2", rotated, e.ints("h/1", half), e.ints("h/2", rotary), e.ints("h/ax", 3))
    a = e.add("Sub", "Sub", e.add("Mul", "x1cos", x1, c), e.add("Mul", "x2sin", x2, s))
    b = e.add("Add", "Add", e.add("Mul", "x2cos", x2, c), e.add("Mul", "x1sin", x1, s))
    if e.attrs.get("interleaved", 0):
        a = e.add("Unsqueeze", "a/pair", a, e.ints("u/a", 4))
        b = e.add("Unsqueeze", "b/pair", b, e.ints("u/a", 4))
        out = e.add("Reshape", "joined", e.add("Concat", "pairs/Concat", a, b, axis=4), e.ints("joined/shape", 0, 0, 0, rotary))
    else:
        out = e.add("Concat", "Concat", a, b, axis=3)
    if rotary != size:
        out = e.add("Concat", "pass", out, e.add("Slice", "unrotated", x, e.ints("r/e", rotary), e.ints("r/end", size),
                                                   e.ints("r/ax", 3)), axis=3)
    if rank == 3:
        out = e.add("Transpose", "merge/Transpose", out, perm=[0, 2, 1, 3])
        e.add("Reshape", "merge", out, e.ints("merge/shape", 0, 0, heads * size), out=e.output(0))
    else:
        e.add("Identity", "Identity", out, out=e.output(0))


# -- n-bit weights --------------------------------------------------------------------------------

def unpack(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """The ``bits``-bit unsigned integers packed little-end first in each byte of ``packed``
    (``[..., bytes]``), the first ``count`` of them along the last axis (int64)."""
    per_byte = 8 // bits
    shifts = torch.arange(per_byte, dtype=torch.int64) * bits
    values = (packed.to(torch.int64).unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], -1)[..., :count]


def dequantize_nbits(e: Expansion) -> torch.Tensor:
    """``W[k, n] = (q[n, k] − zero[n, k // block]) · scale[n, k // block]``: the ``[K, N]`` weights a
    ``MatMulNBits`` multiplies by. Zero points are packed like the weights (``uint8``) or given as
    floats; the default zero point is ``2^(bits−1)``. Computed in float64 (exact), held in the
    scales' float type: the weights onnxruntime multiplies by, at the size of the float model's
    (float64 would double an n-bit language model's weights once more)."""
    k, n, block = (e.required(a) for a in ("K", "N", "block_size"))
    bits = int(e.attrs.get("bits", 4))
    blocks = (k + block - 1) // block
    q = unpack(e.constant(1, "B").reshape(n, blocks, -1), bits, block).reshape(n, blocks * block)
    scales = e.constant(2, "scales")
    if e.input(3):
        zero = e.constant(3, "zero_points")
        zero = zero.double().reshape(n, blocks) if zero.is_floating_point() else \
            unpack(zero.reshape(n, -1), bits, blocks).double()
    else:
        zero = torch.full((n, blocks), float(2 ** (bits - 1)), dtype=torch.float64)
    w = (q.double() - zero.repeat_interleave(block, 1)) * scales.double().reshape(n, blocks).repeat_interleave(block, 1)
    return w[:, :k].t().contiguous().to(scales.dtype)


@expansion("MatMulNBits")
def _matmul_nbits(e: Expansion) -> None:
    """onnxruntime ``MatMulNBits``: ``A @ dequantize(B) (+ bias)``, the weights dequantized once at
    load into a float constant (:func:`dequantize_nbits`) (Jacob et al. 2018, "Quantization and training of neural networks for
    efficient integer-arithmetic-only inference", CVPR: real value = scale · (integer − zero point),
    here per block of ``block_size`` along K). ``g_idx`` (act-order) is refused."""
    e.no_input(4, "g_idx")
    bits = int(e.attrs.get("bits", 4))
    if bits not in (2, 4, 8):
        e.refuse(f"attribute bits={bits}", "is not expanded (2, 4 and 8 are)")
    w = e.const("weight", dequantize_nbits(e))
    if e.input(5):
        t = e.add("MatMul", "MatMul", e.input(0), w)
        e.add("Add", "Add", t, e.input(5), out=e.output(0))
    else:
        e.add("MatMul", "MatMul", e.input(0), w, out=e.output(0))
