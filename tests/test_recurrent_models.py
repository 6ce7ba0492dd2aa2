"""Recurrent taggers and classifiers end to end: ``torch.onnx.export`` of small ``nn.LSTM`` / ``nn.GRU`` /
``nn.RNN`` models over a token embedding (the token ids are the boundary), and onnxruntime's
``quantize_dynamic`` of the LSTM classifier (a ``com.microsoft`` DynamicQuantizeLSTM).

The forward equals onnxruntime's; ``gi`` equals autograd Gradient×Input at the embedding lookup; every
shipped rule set either conserves (the sets with the ``recurrent`` rule, to 1e-10 in float64, and the
Gradient×Input sets with their breaks booked) or ``rulegraph check`` and ``explain`` refuse it with the
same one-line reason.
"""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import rulegraph
from rulegraph.dryrun import dry_run, made_up_inputs
from rulegraph.errors import RulegraphError
from targets import same

F64 = torch.float64
VOCAB, EMBED, HIDDEN, CLASSES = 30, 6, 5, 3
SETS = tuple(sorted(rulegraph.shipped_rule_sets())) + tuple(sorted(rulegraph.shipped_rule_sets("cnns")))
#: the sets whose entry for recurrent cells is the conserving ``recurrent`` rule
RECURRENT_SETS = {"attnlrp", "cp-lrp", "epsilon", "mask-lrp", "epsilon-gamma-box", "epsilon-plus-flat"}


class Recurrent(torch.nn.Module):
    """Embedding → a recurrent layer → a linear head, over every position (``tagger``) or the last one."""

    def __init__(self, cell: str, *, bidirectional: bool, layers: int = 1, tagger: bool = False, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(VOCAB, EMBED)
        self.rnn = getattr(torch.nn, cell)(EMBED, HIDDEN, num_layers=layers, batch_first=True,
                                           bidirectional=bidirectional)
        self.head = torch.nn.Linear(HIDDEN * (2 if bidirectional else 1), CLASSES)
        self.tagger = tagger

    def forward(self, input_ids=None, inputs_embeds=None):
        y, _ = self.rnn(self.embed(input_ids) if inputs_embeds is None else inputs_embeds)
        return self.head(y if self.tagger else y[:, -1])


MODELS = {
    "lstm_bidirectional_classifier": dict(cell="LSTM", bidirectional=True),
    "lstm_two_layer_tagger": dict(cell="LSTM", bidirectional=False, layers=2, tagger=True),
    "gru_bidirectional_tagger": dict(cell="GRU", bidirectional=True, tagger=True),
    "gru_classifier": dict(cell="GRU", bidirectional=False),
    "rnn_bidirectional_classifier": dict(cell="RNN", bidirectional=True),
    "lstm_bidirectional_classifier_quantized": dict(cell="LSTM", bidirectional=True, quantized=True),
    "gru_two_layer_bidirectional_tagger_dynamo": dict(cell="GRU", bidirectional=True, layers=2, tagger=True, dynamo=True),
}
IDS = torch.tensor([[3, 17, 8, 25, 1, 9, 14], [22, 4, 4, 11, 28, 6, 2]])


@pytest.fixture(scope="module", params=list(MODELS))
def exported(request, tmp_path_factory):
    spec = dict(MODELS[request.param])
    quantized = spec.pop("quantized", False)
    dynamo = spec.pop("dynamo", False)
    module = Recurrent(**spec).eval()
    path = tmp_path_factory.mktemp(request.param) / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            tokens = torch.export.Dim("tokens", min=2, max=64)
            torch.onnx.export(module, (IDS,), str(path), input_names=["input_ids"], output_names=["logits"],
                              dynamic_shapes={"input_ids": {1: tokens}}, dynamo=True, verbose=False)
        else:
            torch.onnx.export(module, (IDS,), str(path), input_names=["input_ids"], output_names=["logits"],
                              dynamic_axes={"input_ids": {0: "batch", 1: "tokens"}}, dynamo=False, opset_version=17)
    if quantized:
        from onnxruntime.quantization import quantize_dynamic
        float_path, path = path, path.with_name("model.quant.onnx")
        quantize_dynamic(str(float_path), str(path))
    return request.param, module, str(path), spec


def _ops(path):
    return {(n.domain, n.op_type) for n in onnx.load(path).graph.node}


def test_the_exports_hold_the_recurrent_ops(exported):
    name, _, path, spec = exported
    expected = ("com.microsoft", "DynamicQuantizeLSTM") if "quantized" in name else ("", spec["cell"])
    assert expected in _ops(path)


def _ort(model) -> np.ndarray:
    blob = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"input_ids": IDS.numpy()})[0]


def float_twin(path: str) -> onnx.ModelProto:
    """The quantized graph with its DynamicQuantizeLSTM replaced by the ONNX LSTM of the dequantized
    weights: what rulegraph computes for it."""
    model = onnx.load(path)
    init = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for k, node in enumerate(model.graph.node):
        if node.op_type != "DynamicQuantizeLSTM":
            continue
        names = list(node.input[:8])
        for slot, (q, s, z) in ((1, (1, 8, 9)), (2, (2, 10, 11))):
            scale, zero = init[node.input[s]], init[node.input[z]].astype(np.float32)
            scale, zero = (scale[:, None, None], zero[:, None, None]) if scale.ndim == 1 else \
                (scale[:, None, :], zero[:, None, :])
            w = ((init[node.input[q]].astype(np.float32) - zero) * scale).transpose(0, 2, 1)
            names[slot] = f"{node.input[q]}_dequantized"
            model.graph.initializer.append(onnx.numpy_helper.from_array(w.astype(np.float32), names[slot]))
        lstm = onnx.helper.make_node("LSTM", names, list(node.output), name=node.name)
        lstm.attribute.extend(node.attribute)
        model.graph.node.remove(node)
        model.graph.node.insert(k, lstm)
    return model


def test_forward_equals_onnxruntime(exported):
    """Float exports: onnxruntime's outputs. The quantized one: onnxruntime on its float twin (the LSTM of the
    dequantized weights) to float32 rounding, and onnxruntime's DynamicQuantizeLSTM kernel up to the uint8
    rounding of the activations that kernel adds (rulegraph computes the cell in float)."""
    name, _, path, _ = exported
    got = rulegraph.run(rulegraph.load(path), {"input_ids": IDS})["logits"].numpy()
    if "quantized" not in name:
        np.testing.assert_allclose(got, _ort(path), rtol=1e-4, atol=2e-5)
        return
    np.testing.assert_allclose(got, _ort(float_twin(path)), rtol=1e-4, atol=2e-5)
    kernel = _ort(path)
    assert np.abs(got - kernel).max() <= 0.02 * np.abs(kernel).max()


def _dequantized_embedding(module, path, quantized):
    """The embedding table the graph looks tokens up in (its dequantized table where quantized)."""
    if not quantized:
        return module.embed.weight.detach().double()
    graph = onnx.load(path).graph
    init = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    q, s, z = init["embed.weight_quantized"], init["embed.weight_scale"], init["embed.weight_zero_point"]
    return torch.from_numpy((q.astype(np.float64) - z.astype(np.float64)) * s.astype(np.float64))


def test_gi_equals_autograd_gradient_times_input(exported):
    name, module, path, spec = exported
    quantized = "quantized" in name
    position = 4 if spec.get("tagger") else None
    e = rulegraph.explain(path, "gi", {"input_ids": IDS}, position=position, dtype=F64)
    model = Recurrent(**spec).eval().double()
    model.load_state_dict(module.state_dict())
    if quantized:   # the LSTM of the dequantized weights, as the graph computes it
        graph = onnx.load(path).graph
        init = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
        node = next(n for n in graph.node if n.op_type == "DynamicQuantizeLSTM")
        for k, (q, s, z) in enumerate(((1, 8, 9), (2, 10, 11))):
            w = (init[node.input[q]].astype(np.float64) - init[node.input[z]][:, None, None]) * init[node.input[s]][:, None, None]
            w = torch.from_numpy(w.transpose(0, 2, 1))          # [D, 4H, K], ONNX's gate order iofc
            for d, suffix in enumerate(("", "_reverse")):
                i, o, f, c = w[d].chunk(4)
                getattr(model.rnn, f"weight_{'ih' if k == 0 else 'hh'}_l0{suffix}").data = torch.cat([i, f, c, o])
        head = (init["head.weight_Transposed_quantized"].astype(np.float64)
                - init["head.weight_Transposed_zero_point"]) * init["head.weight_Transposed_scale"]
        model.head.weight.data = torch.from_numpy(head.T.copy())
    words = _dequantized_embedding(module, path, quantized)[IDS].requires_grad_(True)
    logits = model(inputs_embeds=words)
    picked = logits[torch.arange(len(IDS)), position, e.target] if position is not None else \
        logits[torch.arange(len(IDS)), e.target]
    grad, = torch.autograd.grad(picked.sum(), words)
    expected = (grad * words).sum(-1).detach()
    got = e.relevance["input_ids"]
    tolerance = 1e-9
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance * float(expected.abs().max()))


@pytest.mark.parametrize("rules", SETS)
def test_rule_set_conserves_or_check_refuses_with_explain(exported, rules):
    _, _, path, spec = exported
    position = 4 if spec.get("tagger") else None
    graph = rulegraph.load(path)
    run = dry_run(graph, rules, dtype=F64)
    if run.ok:
        e = rulegraph.explain(graph, rules, {"input_ids": IDS}, position=position, dtype=F64)
        c = e.audit.conservation
        assert abs(c.residual) <= 1e-9 * max(1.0, abs(c.output_value)), (rules, c)
        assert not e.audit.unexpected
        cells = [n for n in e.audit.nodes if n.rule == "recurrent"]
        if rules in RECURRENT_SETS:
            assert cells and all(n.conserving and n.relative_error <= 1e-10 for n in cells), (rules, cells)
            assert c.relative_error <= 1e-10 and c.breaks == 0.0, (rules, c)
            e32 = rulegraph.explain(graph, rules, {"input_ids": IDS}, position=position)    # float32: within the audit's tolerance
            assert not e32.audit.unexpected and e32.audit.conservation.relative_error <= 1e-5
        else:
            assert not cells
        return
    assert rules not in RECURRENT_SETS or rules in rulegraph.shipped_rule_sets("cnns"), (rules, [str(g) for g in run.gaps])
    with pytest.raises(RulegraphError) as refused:
        rulegraph.explain(graph, rules, made_up_inputs(graph, run.lengths[0] if run.lengths else 6), dtype=F64)
    message = str(refused.value)
    assert "\n" not in message
    assert any(str(g) == message or (g.node and g.node in message) for g in run.gaps), (message, [str(g) for g in run.gaps])


def test_the_quantized_embedding_moved_before_its_dequantization_becomes_a_float_lookup(exported):
    """quantize_dynamic of a batch-first cell transposes the gathered uint8 rows before dequantizing them:
    the quantization canonizer gathers from the dequantized table instead, and the Transpose moves floats."""
    name, _, path, _ = exported
    if "quantized" not in name:
        pytest.skip("a float export")
    from rulegraph.passes import prepared
    graph, _ = prepared(path, "epsilon")
    assert not [n for n in graph.nodes if n.op == "DequantizeLinear"]
    gathers = [n for n in graph.nodes if n.op == "Gather" and "input_ids" in n.inputs]
    assert len(gathers) == 1 and graph.constants[gathers[0].inputs[0]].is_floating_point()
    readers = {n.op for n in graph.nodes if gathers[0].outputs[0] in n.inputs}
    assert "Transpose" in readers and "DequantizeLinear" not in readers
    assert {"DequantizeLinear"} & {n.op_type for n in onnx.load(path).graph.node}     # it was quantized


def test_the_command_line_checks_and_refuses_alike(exported, capsys):
    """``rulegraph check`` passes a set with an entry for the cells and names the cell where a set has
    none; ``rulegraph explain`` refuses that set with the same reason, in one line (exit 2)."""
    from rulegraph.cli import main
    name, _, path, _ = exported
    if name != "gru_classifier":
        pytest.skip("one model is enough for the command line")
    assert main(["check", path, "-r", "epsilon"]) == 0, capsys.readouterr().out
    capsys.readouterr()
    assert main(["check", path, "-r", "decomposition"]) != 0
    checked = " ".join(capsys.readouterr().out.split())
    code = main(["explain", path, "-r", "decomposition", "-i", "input_ids=3,17,8,25"])
    refused = capsys.readouterr()
    assert code == 2 and "Traceback" not in refused.out + refused.err
    line = " ".join((refused.out + refused.err).split())
    assert "/rnn/GRU" in line and "GRU" in checked and line.split("rule 'linear' cannot apply", 1)[-1] in checked


def _masked_tagger(seed: int = 3):
    """A hand-built bidirectional LSTM over token embeddings whose ``sequence_lens`` are the attention
    mask's row sums (as Keras-style exports with masking have it), its last states to a linear head;
    and the torch module with the same weights (ONNX gate order iofc, torch's ifgo)."""
    from onnx import TensorProto, helper, numpy_helper
    torch.manual_seed(seed)
    embed = torch.nn.Embedding(VOCAB, EMBED)
    lstm = torch.nn.LSTM(EMBED, HIDDEN, batch_first=True, bidirectional=True)
    head = torch.nn.Linear(2 * HIDDEN, CLASSES)

    def onnx_order(t):        # torch's i, f, g, o → ONNX's i, o, f, c
        i, f, g, o = t.detach().chunk(4)
        return torch.cat([i, o, f, g]).numpy()

    w = np.stack([onnx_order(lstm.weight_ih_l0), onnx_order(lstm.weight_ih_l0_reverse)])
    r = np.stack([onnx_order(lstm.weight_hh_l0), onnx_order(lstm.weight_hh_l0_reverse)])
    b = np.stack([np.concatenate([onnx_order(getattr(lstm, f"bias_ih_l0{s}")), onnx_order(getattr(lstm, f"bias_hh_l0{s}"))])
                  for s in ("", "_reverse")])
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["emb"], name="embed"),
        helper.make_node("Transpose", ["emb"], ["x"], perm=[1, 0, 2], name="time_major"),
        helper.make_node("ReduceSum", ["attention_mask", "axis1"], ["lens64"], keepdims=0, name="lengths"),
        helper.make_node("Cast", ["lens64"], ["lens"], to=TensorProto.INT32, name="lens"),
        helper.make_node("LSTM", ["x", "W", "R", "B", "lens"], ["y", "y_h"], hidden_size=HIDDEN,
                         direction="bidirectional", name="lstm"),
        helper.make_node("Transpose", ["y_h"], ["h"], perm=[1, 0, 2], name="batch_major"),
        helper.make_node("Reshape", ["h", "flat"], ["features"], name="flatten"),
        helper.make_node("Gemm", ["features", "Wo", "bo"], ["logits"], transB=1, name="head"),
    ]
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in
             (("E", embed.weight.detach().numpy()), ("W", w), ("R", r), ("B", b),
              ("Wo", head.weight.detach().numpy()), ("bo", head.bias.detach().numpy()))]
    inits += [numpy_helper.from_array(np.array([1], np.int64), "axis1"),
              numpy_helper.from_array(np.array([0, -1], np.int64), "flat")]
    graph = helper.make_graph(nodes, "masked_lstm", [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model, embed, lstm, head


def test_sequence_lens_from_the_attention_mask():
    """Rows padded after their length: the forward equals onnxruntime's, ``gi`` equals autograd through
    torch's packed LSTM (the padding never read), and the ε set conserves with the padding's ids getting 0."""
    model, embed, lstm, head = _masked_tagger()
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]])
    feeds = {"input_ids": IDS, "attention_mask": mask}
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {k: v.numpy() for k, v in feeds.items()})[0]
    np.testing.assert_allclose(rulegraph.run(rulegraph.load(model), feeds)["logits"].numpy(), ref, rtol=1e-4, atol=2e-5)

    e = rulegraph.explain(model, "gi", feeds, dtype=F64)
    embed, lstm, head = embed.double(), lstm.double(), head.double()
    words = embed.weight.detach()[IDS].requires_grad_(True)
    packed = torch.nn.utils.rnn.pack_padded_sequence(words, mask.sum(1), batch_first=True, enforce_sorted=False)
    _, (h, _) = lstm(packed)
    logits = head(h.transpose(0, 1).reshape(len(IDS), -1))
    grad, = torch.autograd.grad(logits[torch.arange(len(IDS)), e.target].sum(), words)
    torch.testing.assert_close(e.relevance["input_ids"], (grad * words).sum(-1).detach(), rtol=1e-9, atol=1e-12)

    e = rulegraph.explain(model, "epsilon", feeds, dtype=F64)
    c = e.audit.conservation
    assert c.relative_error <= 1e-10 and c.breaks == 0.0 and not e.audit.unexpected
    assert float(e.relevance["input_ids"][1, 4:].abs().max()) == 0.0          # past the row's length
    assert float(e.relevance["input_ids"][1, :4].abs().max()) > 0.0


@pytest.mark.parametrize("rules", ["epsilon", "gi"])
def test_every_class_in_one_batched_walk_equals_each_alone(exported, rules):
    """The recurrent rule and the cells' VJPs under the batched walk of ``targets=`` (a target axis,
    :func:`rulegraph.passes.relevance.walk_many`): each class's map and audit equal its own walk's."""
    _, _, path, _ = exported
    feeds = {"input_ids": IDS}
    many = rulegraph.explain(path, rules, feeds, targets="all", dtype=F64)
    for e in many:
        same(e, rulegraph.explain(path, rules, feeds, target=e.target[0], dtype=F64))
