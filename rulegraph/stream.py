"""The residual stream of a transformer export: the hidden states its blocks hand on (what Hugging
Face's ``output_hidden_states`` lists), read off the graph's layers and its token lookup."""
from __future__ import annotations

from .errors import ModelError
from .ir import Graph, Node
from .ops import find


def hidden_states(graph: Graph) -> list[str]:
    """The residual stream between the blocks, as Hugging Face's ``output_hidden_states`` lists it:
    ``[h_0, h_1, …, h_L]`` with ``h_0`` what the embeddings hand to block 0 and ``h_l`` the value
    block ``l − 1`` (of :attr:`Graph.layers`) hands on.

    The value a layer hands on is the last-produced value of that layer that depends on the token
    embeddings (the largest embedding table's ``Gather``) and is read by a node of another layer
    (or is a graph output); the attention mask, which other layers read too, does not depend on
    the embeddings' values (dependence through ``Shape`` / ``Size`` does not count). For a post-LN block (BERT) this is the output of its last LayerNorm; for a
    pre-LN block (GPT-2) the residual sum after its MLP, before the next block's (or the final)
    LayerNorm; ``h_0`` is the embeddings' LayerNorm output (BERT) or the sum of token and
    position embeddings (GPT-2).
    """
    from .facts import roles
    table = roles(graph).table
    if table is None:
        raise ModelError("the model has no embedding lookup (a Gather of a float table by an integer input)")
    token = table.node
    layers = graph.layers
    reached = set(token.outputs)
    readers: dict[str, set[str]] = {}
    for n in graph.nodes:
        if not _shape_only(n) and any(v in reached for v in n.inputs if v):
            reached.update(v for v in n.outputs if v)
        for v in n.inputs:
            readers.setdefault(v, set()).add(layers[n.name])
    outputs = set(graph.outputs)
    handed: dict[str, str] = {}          # layer → its last value read elsewhere
    for n in graph.nodes:
        layer = layers[n.name]
        for v in n.outputs:
            if v and v in reached and (readers.get(v, set()) - {layer} or v in outputs):
                handed[layer] = v
    blocks = sorted(int(k.split()[1]) for k in handed if k.startswith("block "))
    if not blocks or "embeddings" not in handed:
        raise ModelError("no transformer blocks found: the node scopes and names carry no block numbers")
    return [handed["embeddings"], *(handed[f"block {b}"] for b in blocks)]


def _shape_only(node: Node) -> bool:
    """Whether the node reads only its input's shape (Shape, Size: the op's ``shape_only`` trait)."""
    spec = find(node.op, node.domain)
    return spec is not None and spec.shape_only
