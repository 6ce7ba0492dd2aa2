"""Weights in any floating dtype: tiny random Llama and GPT-2 causal LMs saved in bfloat16 and float16
export (the weights stay in their dtype), load, and explain in the dtype asked — float64, float32 and
the checkpoint's own half precision — conserving to that dtype's tolerance under every shipped rule
set; `gi` in float64 equals autograd Gradient×Input of the module. Stabilisers are floored per dtype."""
from __future__ import annotations


import pytest
import torch

import rulegraph
import tiny
from rulegraph.cli import main
from rulegraph.errors import InputError
from rulegraph.interpreter import prepare
from rulegraph.tolerances import STABILISER_FLOOR, stabiliser, tolerance

CHECKPOINTS = [("llama", torch.bfloat16), ("llama", torch.float16), ("gpt2", torch.bfloat16), ("gpt2", torch.float16)]


@pytest.fixture(scope="module", params=CHECKPOINTS, ids=lambda p: f"{p[0]}-{str(p[1]).removeprefix('torch.')}")
def checkpoint(request, tmp_path_factory):
    """(HF module in the checkpoint's dtype, its dtype, the export's path), exported by `rulegraph export`."""
    kind, dtype = request.param
    folder = tmp_path_factory.mktemp(f"{kind}_{dtype}")
    module = tiny.causal_lm(kind).to(dtype)
    module.save_pretrained(folder / "hf")
    tiny.lm_tokenizer().save(str(folder / "hf" / "tokenizer.json"))
    assert main(["export", str(folder / "hf"), str(folder / "out")]) == 0
    return module, dtype, folder / "out" / "model.onnx"


def test_the_weights_keep_their_dtype(checkpoint):
    _, dtype, path = checkpoint
    graph = rulegraph.load(path)
    table = max(graph.constants.values(), key=lambda t: t.numel())
    assert table.dtype == dtype


@pytest.mark.parametrize("compute", ["own", "float64"])
def test_every_rule_set_conserves_in_the_dtype_asked(checkpoint, compute):
    """In the checkpoint's own dtype on every checkpoint; in float64 (the weights widened) on one
    checkpoint per architecture (the others only add time)."""
    module, saved, path = checkpoint
    if compute == "float64" and (module.config.model_type == "llama") != (saved == torch.bfloat16):
        pytest.skip("float64 runs on llama-bfloat16 and gpt2-float16")
    dtype = saved if compute == "own" else torch.float64
    graph = rulegraph.load(path)
    feeds = tiny.token_inputs(("input_ids", "attention_mask"), batch=1, length=9)
    for rules in sorted(rulegraph.shipped_rule_sets()):
        e = rulegraph.explain(graph, rules, feeds, dtype=dtype)
        assert e.output_tensor.dtype == dtype, rules
        c = e.audit.conservation
        assert abs(c.output_value) > 1e-3, rules
        assert abs(c.residual) <= tolerance(dtype) * abs(c.output_value), (rules, c.residual / c.output_value)
        assert e.audit.tolerance == tolerance(dtype) and not e.audit.unexpected, rules


def test_half_precision_scores_are_close_to_float64(checkpoint):
    """The same checkpoint explained in its own dtype ranks the tokens as float64 does, and its
    scores differ by a few of that dtype's rounding steps."""
    _, saved, path = checkpoint
    graph = rulegraph.load(path)
    feeds = tiny.token_inputs(("input_ids", "attention_mask"), batch=1, length=9)
    exact = torch.as_tensor(rulegraph.explain(graph, "lrp-ah-ln", feeds, dtype=torch.float64).scores("input_ids"))
    half = torch.as_tensor(rulegraph.explain(graph, "lrp-ah-ln", feeds, dtype=saved).scores("input_ids"))
    assert (half - exact).abs().max() <= 8 * torch.finfo(saved).eps * exact.abs().max()


def test_gi_in_float64_equals_autograd(checkpoint):
    module, _, path = checkpoint
    feeds = tiny.token_inputs(("input_ids", "attention_mask"), batch=1, length=9)
    e = rulegraph.explain(path, "gi", feeds, dtype=torch.float64)
    expected = tiny.next_token_gi(module, feeds, e.target[0])
    ours = torch.as_tensor(e.scores("input_ids"), dtype=torch.float64)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()))


def test_the_command_line_takes_the_half_precisions(checkpoint, capsys):
    _, saved, path = checkpoint
    name = str(saved).removeprefix("torch.")
    assert main(["explain", str(path), "-r", "attnlrp", "-t", "w1 w2 w3", "--dtype", name]) == 0
    assert "unexpected breaks" in capsys.readouterr().out


def test_a_dtype_that_is_not_a_float_is_refused(checkpoint):
    graph = rulegraph.load(checkpoint[2])
    with pytest.raises(InputError, match="dtype must be one of float32, float64, bfloat16, float16"):
        prepare(graph, "cpu", torch.int32)


def test_the_stabiliser_is_floored_per_dtype():
    assert stabiliser(1e-6, torch.float32) == 1e-6 and stabiliser(1e-6, torch.bfloat16) == 1e-6
    assert stabiliser(1e-6, torch.float16) == STABILISER_FLOOR[torch.float16] == torch.finfo(torch.float16).tiny
    assert stabiliser(0.1, torch.float16) == 0.1 and stabiliser(0.0, torch.float16) == 0.0


def test_the_epsilon_rule_divides_by_the_floored_stabiliser_in_float16():
    """A one-node linear layer z = x W + b in float16 whose explained output is z = 2⁻¹⁰ exactly (every
    product and sum representable): LRP-ε's R_i = x_i w_i · z / (z + ε) with ε raised to float16's
    smallest normal number (a 6% share absorbed), not the rule's 1e-6 (0.1%)."""
    from onnx import TensorProto, helper, numpy_helper
    w = torch.tensor([[0.5, 0.5], [1.0, 0.25], [-1.0, 1.0], [0.5, 2.0]])     # x · W[:, 1] = 1
    b = torch.tensor([0.0, -(1 - 2**-10)])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    graph = helper.make_graph(nodes, "lin", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
                              [numpy_helper.from_array(w.numpy(), "W"), numpy_helper.from_array(b.numpy(), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    rules = rulegraph.RuleSet.from_yaml("boundary: inputs\nrules:\n  - op: Add\n    rule: epsilon\n"
                                        "  - op: '*'\n    rule: gradient\n")
    x = torch.tensor([[1.0, -2.0, 0.5, 0.25]])
    e = rulegraph.explain(model, rules, {"x": x}, target=1, dtype=torch.float16)
    z, eps = 2**-10, torch.finfo(torch.float16).tiny
    expected = (x * w[:, 1]).double() * z / (z + eps)
    torch.testing.assert_close(torch.as_tensor(e.boundary["x"], dtype=torch.float64), expected, rtol=2e-3, atol=0)
    unfloored = (x * w[:, 1]).double() * z / (z + 1e-6)
    assert ((expected - unfloored).abs() > 0.05 * unfloored.abs()).all()     # far above float16's rounding
