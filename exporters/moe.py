"""Mixture-of-experts for export: every expert on every token, weighted by a dense routing matrix.

A top-k-routed MoE block (Mixtral, Qwen3-MoE, OLMoE… — every transformers experts module built with
``@use_experts_implementation``) sends each token to the k experts its router picks. Transformers'
own implementations select the tokens of each expert by value (``nonzero``, ``histc`` and grouped
matrix products), which neither ONNX exporter can trace into a graph that holds for other inputs.
:func:`dense_experts_forward` computes the same sum without selecting: the router's top-k weights
are scattered into a ``[tokens, experts]`` matrix that is zero where an expert was not picked, every
expert runs on every token as one batched product (``[experts, tokens, ·]``), and the outputs are
weighted by that matrix and summed over the experts::

    routing = zeros(T, E).scatter(1, top_k_index, top_k_weights)          # ScatterElements
    h = act(x W_gate[e]ᵀ) · (x W_up[e]ᵀ)  for all e at once                  # [E, T, I]
    y = Σ_e (h W_down[e]ᵀ) · routingᵀ[e, :, None]                            # Mul, ReduceSum over E

The result equals the model's (an unpicked expert's output is multiplied by 0), at E/k times the
expert arithmetic. In the graph, the router's weights meet the experts' outputs in one ``Mul``
whose second input comes from the ``ScatterElements`` (:data:`ROUTING`): the rule sets hold it
constant there (the AH view of Ali et al. 2022, Sec. 4: routing weights are to experts what
attention probabilities are to values), so an expert's output receives its share of the block's
relevance and an unpicked expert none. :func:`use_dense_experts` registers the implementation
with transformers' experts interface and switches a loaded model to it, as :func:`load_hf` picks
eager attention.
"""
from __future__ import annotations

import torch

#: the name the implementation is registered under in transformers' ``ExpertsInterface``
DENSE = "rulegraph_dense"


def dense_experts_forward(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                          top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts module's output for ``hidden_states`` ``[T, H]`` routed to ``top_k_index`` ``[T, k]``
    with ``top_k_weights``, every expert computed on every token (see the module docstring). Honours the
    layouts transformers' experts interface declares: gated or not, biases, transposed weights, a
    norm after each expert."""
    tokens = hidden_states.shape[0]
    routing = torch.zeros(tokens, self.num_experts, dtype=top_k_weights.dtype, device=hidden_states.device)
    routing = routing.scatter(1, top_k_index, top_k_weights)                            # [T, E]
    x = hidden_states.unsqueeze(0)                                                       # [1, T, H]
    up = self.gate_up_proj if self.has_gate else self.up_proj
    h = torch.matmul(x, up if self.is_transposed else up.transpose(1, 2))              # [E, T, out]
    if self.has_bias:
        h = h + (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias).unsqueeze(1)
    h = self._apply_gate(h) if self.has_gate else self.act_fn(h)                        # [E, T, I]
    out = torch.matmul(h, self.down_proj if self.is_transposed else self.down_proj.transpose(1, 2))
    if self.has_bias:
        out = out + self.down_proj_bias.unsqueeze(1)                                    # [E, T, H]
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    weighted = out * routing.transpose(0, 1).unsqueeze(-1).to(out.dtype)              # [E, T, H]
    return weighted.sum(0).to(hidden_states.dtype)


def has_experts(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds a transformers experts module whose implementation can be chosen."""
    return any(hasattr(m, "_apply_gate") and hasattr(m, "num_experts") for m in model.modules())


def use_dense_experts(model: torch.nn.Module) -> bool:
    """Switch a loaded transformers model's experts modules to :func:`dense_experts_forward`
    (registered once with transformers' ``ExpertsInterface``); ``False`` if it has none."""
    if not has_experts(model) or not hasattr(model, "set_experts_implementation"):
        return False
    from transformers.integrations.moe import ExpertsInterface
    if DENSE not in ExpertsInterface._global_mapping:
        ExpertsInterface.register(DENSE, dense_experts_forward)
    model.set_experts_implementation(DENSE)
    return True
