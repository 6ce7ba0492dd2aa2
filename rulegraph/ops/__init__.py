"""Op registry: each ONNX op type is a torch function plus what the rules need to know.

An op is registered with :func:`op`::

    @op("MatMul", affine=at_most_one(0, 1), product="contraction", vjp=_matmul_vjp)
    def matmul(a, b):
        return torch.matmul(a, b)

The forward takes the node's inputs positionally (``None`` for an omitted optional
input) and its ONNX attributes as keywords. Inputs listed in ``static`` arrive as
Python lists of ints (shapes, axes, pads), converted once per input shape.

What the relevance rules read from an :class:`OpSpec`:

``vjp``
    ``vjp(grads, inputs, outputs, wants, **attrs) -> list`` — the vector-Jacobian
    product per input (``None`` where not wanted). Ops without one fall back to
    torch autograd on a recomputation (:func:`autograd_vjp`).
``affine(tainted)``
    Whether the op is affine in the inputs flagged ``tainted`` when the others are
    held fixed. On such ops the gradient/z rules conserve relevance exactly.
``additive``
    Inputs that enter the output additively (a bias, the other summand, a Concat
    piece). The share a rule hands to such an input when it is a constant is
    *absorbed*; multiplicative constants (weights) take no share.
``routing``
    The op only moves, copies or selects elements of its data inputs (Reshape,
    Transpose, Slice, Gather with fixed indices…); the ``pass`` rule applies.
``bijective``
    A routing op moving each element of its one data input to exactly one place (Reshape,
    Transpose, Squeeze…): the relevance it hands back sums to what arrived, so the audit reads
    that sum instead of taking it again.
``elementwise``
    One data input, output of the same shape, position by position (``identity`` rule).
``activation``
    An elementwise nonlinearity of a network (ReLU, GELU, tanh, sigmoid, HardSwish…): what
    the rule sets' ``trait: activation`` entries select.
``sigmoidal``
    An S-shaped squashing function (Erf, tanh, sigmoid, hard sigmoid): the source of a gate
    in ``x · ½(1 + erf(x/√2))``, ``x · σ(x)`` (``from: sigmoidal`` in a pattern).
``normalization``
    Normalises its input by the input's own statistics (LayerNorm, RMSNorm, InstanceNorm): the LN rule.
    The op declares those statistics (:class:`~rulegraph.ops.spec.Normalization`: the dims, centring,
    1/σ or 1/rms, γ and β per channel or not), so the rules that hold them constant (``ln``,
    ``layernorm``) compute them from the declaration, not from the op's name.
``product``
    A product of two inputs that may both be activations (``contraction``: MatMul, Einsum;
    ``elementwise``: Mul; ``affine``: Gemm): the ops of the AH, uniform and product rules, and the
    value product of an attention block (a contraction, :mod:`rulegraph.heads`).
``arithmetic``
    Add, Sub, Mul, Div: what a gate pattern looks through (``through: [arithmetic, routing]``).
``routing_if``
    Routing for some attribute values only (ScatterND / ScatterElements with reduction ``none``: each
    output element is data's or one update's); the input boundary follows ids through them.
``boolean``
    Outputs a mask (comparisons, logic): a value computed from it depends on where the input holds
    something, not on the input's values.
``pointwise``
    Each output element is a number computed from the inputs' elements at the same position under
    numpy broadcasting: the elementwise and arithmetic ops (implied by those traits), Pow, Mod,
    Min, Max, Sum, Mean, Where. Comparisons and logic are not: their outputs are masks, not
    numbers. The input boundary follows token ids through these and the routing ops
    (:mod:`rulegraph.boundary`).
``sequence``
    Takes or returns ONNX tensor sequences (:class:`~rulegraph.ops.sequence.TensorSequence`): the
    forward runs them; relevance cannot pass through them.
``shape_only``
    Reads only its input's shape, never its values (Shape, Size).
``float_output``
    ``False`` for ops whose outputs are integers or booleans (Shape, ArgMax, Equal…):
    relevance never flows through them; a function of the node for Cast.
``held``
    The output depends on the input values but never carries relevance: the rules hold it constant
    (rulegraph's ``QuantizationError``).
``transparent``
    The output is input 0 plus a term the rules hold constant (rulegraph's ``QuantizeDequantize``):
    producer patterns look through it.
``bias``
    How the op adds its additive constant input (a Conv's or Gemm's bias) to the output, for
    the rules that book a bias's share without running the op on zeros.
``size``
    The number of elements of the output from the arguments, for an op whose output can outgrow its
    inputs (Expand, Tile, MatMul…): checked against the one-tensor budget before the op runs (:mod:`rulegraph.limits`).
``cheap`` / ``outgrows``
    What the value lifetimes read (:mod:`rulegraph.lifetimes`): a cheap op's output (Add, Sub, Mul, Div,
    Softmax, Cast, Where) is computed again by a walk where it is large rather than kept; a product of two
    activations that outgrows them (attention scores) likewise.
``into`` / ``recycles``
    An elementwise op that can write its output into a dying input (``into``: the same kernel, the same
    bits); an op whose forward or VJP takes ``recycler=`` (read off its signature) writes into a tensor
    the explanation has finished with.
``defaults``
    The forward's keyword defaults: the ONNX attribute defaults (a test checks them
    against the ONNX schemas). The interpreter completes every node's attributes with
    them once, so no rule repeats a default.
"""
from __future__ import annotations

from . import elementwise, linalg, nn, reduce, sequence, shape, vision, quantization, recurrent  # noqa: F401  (register the ops, in this order)
from .spec import (PRODUCT_KINDS, REGISTRY, TRAITS, Normalization, OpSpec, always, at_most_one, autograd_vjp, declaring, find,
                   lookup, never, only, op, unbroadcast, unsupported, vjp)

__all__ = ["PRODUCT_KINDS", "REGISTRY", "TRAITS", "Normalization", "OpSpec", "always", "at_most_one", "autograd_vjp",
           "declaring", "find", "lookup", "never", "only", "op", "unbroadcast", "unsupported", "vjp"]
