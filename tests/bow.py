"""A linear bag-of-words classifier as an ONNX graph: the exact contribution of every token is known.

``logits[b] = Σ_t mask[b, t] · W[ids[b, t]]`` with ``W[v] = (−w_v / 2, w_v / 2)`` and
``w = 0`` for [PAD], [UNK], [CLS] and [SEP]. The logit difference is ``Σ_t w``, so
p(positive) = σ(Σ_t w) and a token's contribution to the explained logit is ``±w / 2``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import tiny

SPECIAL = ("[PAD]", "<pad>", "[CLS]", "[SEP]", "[UNK]")


def weights(seed: int = 0) -> np.ndarray:
    """w per vocabulary id (0 for the special tokens), distinct values."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(-1.0, 1.0, len(tiny.VOCAB))
    for token in SPECIAL:
        w[tiny.VOCAB.index(token)] = 0.0
    return w


def table(w: np.ndarray) -> np.ndarray:
    return np.stack([-w / 2, w / 2], axis=1).astype(np.float32)


def build(folder: Path, seed: int = 0) -> Path:
    """``folder/model.onnx`` (+ tokenizer.json); inputs input_ids, attention_mask."""
    folder.mkdir(parents=True, exist_ok=True)
    nodes = [
        helper.make_node("Gather", ["W", "input_ids"], ["emb"], name="embeddings"),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"], name="unsqueeze"),
        helper.make_node("Mul", ["emb", "mask3"], ["masked"], name="mul"),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["logits"], keepdims=0, name="sum"),
    ]
    graph = helper.make_graph(
        nodes, "bow",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(table(weights(seed)), "W"),
         numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
         numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    for key, value in {"rulegraph.labels": json.dumps(["negative", "positive"]), "rulegraph.max_length": "64"}.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(model)
    path = folder / "model.onnx"
    onnx.save(model, path)
    tiny.tokenizer().save(str(folder / "tokenizer.json"))
    return path
