"""Attention blocks and their heads in an exported graph.

An attention block is found by its two nodes: the **Softmax** whose output are the attention
probabilities ``[batch, heads, query, key]``, and the **value product**, the MatMul / Einsum
whose input 0 is that Softmax's output (possibly through routing ops: the Where of an SDPA
export's NaN guard, a Cast, Dropout) and whose input 1 are the values ``[batch, heads,
key, d_head]`` — :data:`rulegraph.patterns.PROBABILITIES`, the pattern of the ``ah`` entry of
``rules/lrp-ah.yaml``. This holds for
BERT-, RoBERTa-, DistilBERT- and GPT-2-style models from the TorchScript and dynamo ONNX
exporters and from ``torch.export``.

Blocks are numbered like the audit's layers: :meth:`Graph.block_of` the value product (``block i``
from the exporter's scope or the node's name), and in graph order where a graph names no blocks or
two blocks share a number (:func:`block_numbers`). A head mask is keyed by that number only where
the graph names its blocks (:func:`unkeyed`): ``rulegraph heads calibrate`` and the ``head-mask``
rule refuse the same graphs.

**The head count** is read from the shapes, not from a config: the graph is run once on a
small dummy input (:func:`rulegraph.facts.dummy_inputs`, 1 × 5 tokens) and the head count is dimension 1 of
the Softmax output, checked against dimension 1 of the value product's output. The
Reshape / Transpose that split the hidden size before the product often take their target
shape from computed values (dynamic axes), so reading a constant there would not always
work; one tiny forward always does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import InputError
from .ir import Graph, Node
from .facts import dummy_inputs
from .ops import declaring
from .patterns import PROBABILITIES

#: ops computing the value product: the contractions (MatMul, Einsum)
PRODUCTS = declaring("product", "contraction")


@dataclass(frozen=True)
class AttentionBlock:
    """One attention block: its number, head count and the nodes that make it."""

    block: int                 # the block number (``block i`` of :attr:`Graph.layers`)
    heads: int                 # number of heads (dimension 1 of the probabilities)
    softmax: str               # the Softmax node
    product: str               # the probabilities × values node
    probs: str                 # the value holding the probabilities fed to the product


def attention_nodes(graph: Graph) -> list[tuple[Node, Node]]:
    """(Softmax, value product) pairs in graph order, without running anything."""
    found = []
    for node in graph.nodes:
        if node.op in PRODUCTS and node.inputs and node.inputs[0]:
            softmax = PROBABILITIES.source(graph, node.inputs[0])
            if isinstance(softmax, Node):
                found.append((softmax, node))
    return found


def block_numbers(graph: Graph) -> dict[str, int]:
    """Each attention block's value product → its block number: :meth:`Graph.block_of` the product,
    where every product has one and no two share it, else graph order (computed once per graph)."""
    if graph.cache.products is None:
        products = [p for _, p in attention_nodes(graph)]
        numbers = [graph.block_of(p) for p in products]
        if None in numbers or len(set(numbers)) != len(numbers):     # unnumbered or shared numbers: graph order
            numbers = list(range(len(products)))
        graph.cache.products = {p.name: b for p, b in zip(products, numbers)}
    return graph.cache.products


def unkeyed(graph: Graph, node: Node) -> str | None:
    """Why the head masks of ``node``'s block cannot be keyed by a block number (``None``: they can):
    a mask file names each block by the number :meth:`Graph.block_of` its value product, which
    ``rulegraph heads calibrate`` writes and the ``head-mask`` rule reads; a graph that numbers its
    attention blocks otherwise (no number, or two blocks sharing one) is refused by both alike."""
    own = graph.block_of(node)
    if own is None:
        return f"the value product {node.name!r} has no block number in its scope or name"
    products = block_numbers(graph)
    shared = [p for p in products if p != node.name and graph.block_of(graph.node(p)) == own]
    if node.name in products and shared:
        return (f"the value product {node.name!r} shares block number {own} with another attention block "
                f"({shared[0]!r}: their scopes and names do not tell them apart)")
    return None


def find_heads(graph: Graph, inputs: dict[str, torch.Tensor] | None = None) -> list[AttentionBlock]:
    """Every attention block of ``graph`` with its head count, in block order (see the module doc).

    ``inputs``: what to run for the shapes (default :func:`rulegraph.facts.dummy_inputs`). Raises
    :class:`InputError` where a probabilities tensor is not ``[batch, heads, query, key]``.
    """
    from .interpreter import prepare
    pairs = attention_nodes(graph)
    if not pairs:
        return []
    if inputs is None and graph.cache.heads is not None:
        return graph.cache.heads
    plan = prepare(graph)
    keep = frozenset(v for s, p in pairs for v in (s.outputs[0], p.outputs[0]))
    with torch.no_grad():
        env = plan.run(inputs if inputs is not None else dummy_inputs(graph), keep=keep)
    blocks, numbers = [], block_numbers(graph)
    for softmax, product in pairs:
        probs, out = env[softmax.outputs[0]], env[product.outputs[0]]
        if probs.dim() != 4 or out.dim() != 4 or out.shape[1] != probs.shape[1]:
            raise InputError(f"attention at {product.name!r}: probabilities {tuple(probs.shape)} and product "
                             f"{tuple(out.shape)}; expected [batch, heads, query, key] and [batch, heads, query, d]")
        blocks.append(AttentionBlock(numbers[product.name], int(probs.shape[1]), softmax.name, product.name,
                                     product.inputs[0]))
    blocks.sort(key=lambda b: b.block)
    if inputs is None:
        graph.cache.heads = blocks
    return blocks


# -- head masks (Song et al. 2024, "Better Explain Transformers by Illuminating Important Information",
#    EACL Findings, Sec. 4.2: M = M_synt + M_pos, Eq. 6) -------------------------------------------------

#: the type of a head in a mask file; ``none`` heads are masked out
HEAD_TYPES = ("positional", "syntactic", "none")
MASK_KEYS = ("heads", "model", "data", "thresholds", "details", "note")


@dataclass(frozen=True)
class HeadMasks:
    """Per block, per head: ``positional`` / ``syntactic`` / ``none`` (``M[b, m] = 1`` unless none)."""

    types: dict[int, tuple[str, ...]]
    source: str = "<inline>"

    def of(self, block: int, heads: int) -> tuple[str, ...] | None:
        """The head types of ``block`` (``None``: the mask does not name the block, keep every head)."""
        t = self.types.get(block)
        if t is not None and len(t) != heads:
            raise InputError(f"{self.source}: block {block} lists {len(t)} heads, the graph's has {heads}")
        return t

    @property
    def rate(self) -> float:
        """The fraction of heads kept, ‖M‖ / (B·H)."""
        flat = [t for ts in self.types.values() for t in ts]
        return sum(t != "none" for t in flat) / max(1, len(flat))


def _mask_error(source: str, node, message: str) -> InputError:
    line = f":{node.start_mark.line + 1}" if node is not None and getattr(node, "start_mark", None) else ""
    return InputError(f"{source}{line}: {message}")


def parse_masks(text: str, source: str = "<string>") -> HeadMasks:
    """A mask file's text (YAML or JSON) → :class:`HeadMasks`; errors name ``file:line`` and the valid
    choices. The file is ``heads: {block: [type per head, …], …}`` plus optional ``model``, ``data``,
    ``thresholds``, ``details`` and ``note`` (what ``rulegraph heads calibrate`` writes)."""
    import yaml
    from .errors import choices
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputError(f"{source}{f':{mark.line + 1}' if mark else ''}: not valid YAML/JSON: "
                         f"{getattr(exc, 'problem', exc)}") from None
    if not isinstance(root, yaml.MappingNode):
        raise _mask_error(source, root, "a mask file is a mapping with `heads: {block: [types per head]}`")
    fields = {}
    for k, v in root.value:
        if k.value not in MASK_KEYS:
            raise _mask_error(source, k, f"unknown key {k.value!r}; {choices(MASK_KEYS, k.value)}")
        fields[k.value] = v
    if "heads" not in fields:
        raise _mask_error(source, root, "missing `heads:` (block → list of head types)")
    masks = HeadMasks(_types(fields["heads"], source), source)
    if not masks.types or masks.rate == 1.0:
        import warnings
        warnings.warn(f"{source}: the head mask {'names no block' if not masks.types else 'keeps every head'}, so "
                      "Mask-LRP equals its base rules (nothing is masked); `rulegraph heads calibrate` writes one "
                      "that keeps the positional and syntactic heads", stacklevel=2)
    return masks


def _types(node, source: str) -> dict[int, tuple[str, ...]]:
    import yaml
    from .errors import choices
    if isinstance(node, yaml.ScalarNode) and node.value in ("", "null", "~"):
        return {}
    if not isinstance(node, yaml.MappingNode):
        raise _mask_error(source, node, "`heads:` must map block numbers to lists of head types")
    out: dict[int, tuple[str, ...]] = {}
    for k, v in node.value:
        try:
            block = int(k.value)
        except ValueError:
            block = -1
        if block < 0 or not isinstance(k, yaml.ScalarNode):
            raise _mask_error(source, k, f"block {k.value!r} must be a block number (0, 1, …)")
        if block in out:
            raise _mask_error(source, k, f"block {block} is listed twice")
        if not isinstance(v, yaml.SequenceNode) or not v.value:
            raise _mask_error(source, v, f"block {block}: give a list of head types ({', '.join(HEAD_TYPES)})")
        types = []
        for item in v.value:
            if not isinstance(item, yaml.ScalarNode) or item.value not in HEAD_TYPES:
                raise _mask_error(source, item, f"block {block}: head type {getattr(item, 'value', '?')!r} is not "
                                                f"valid; {choices(HEAD_TYPES, str(getattr(item, 'value', '')))}")
            types.append(item.value)
        out[block] = tuple(types)
    return out


def read_masks(path) -> HeadMasks:
    from pathlib import Path
    from .errors import read_text
    p = Path(path)
    return parse_masks(read_text(p, "mask file", InputError), str(p))


def inline_masks(value, source: str = "<inline>") -> HeadMasks:
    """Masks given inline in a rule file's params: ``{block: [types]}`` (or ``{heads: {…}}``)."""
    import yaml
    data = value.get("heads", value) if isinstance(value, dict) else value
    return parse_masks(yaml.safe_dump({"heads": data}), source)


def mask_text(types: dict[int, list[str]], **header) -> str:
    """The YAML of a mask file (``header``: model, data, thresholds, details, note)."""
    import yaml
    lines = ["# head mask (Song et al. 2024, Sec. 4.2): per block, the type of each head;",
             "# positional / syntactic heads are kept, none heads are masked out",
             yaml.safe_dump({k: v for k, v in header.items() if v is not None}, sort_keys=False,
                            default_flow_style=None, width=120).rstrip() if header else "",
             "heads:"]
    lines += [f"  {b}: [{', '.join(ts)}]" for b, ts in sorted(types.items())]
    return "\n".join(x for x in lines if x) + "\n"
