"""State-space models' scans for export: the recurrence written as one product with a kernel, at any length.

Mamba's selective state-space layer (Gu & Dao 2023, Alg. 2) runs, per channel d and state n,

    h_t = exp(Δ_t A) ⊙ h_{t−1} + Δ_t B_t x_t,        y_t = C_t · h_t + D x_t

with Δ, B, C computed from the input. transformers' module runs it as a Python loop over the positions,
which both ONNX exporters unroll at the example's length: the graph then holds for that length only, and
``rulegraph export``'s check refuses it. Unrolled in closed form, with S_t = Σ_{r≤t} Δ_r (a cumulative
sum), the same output is

    y_t = Σ_{s≤t} K_{t,s} x_s + D x_t,      K_{t,s} = Σ_n C_{t,n} exp(A_n (S_t − S_s)) Δ_s B_{s,n}

the "hidden attention" of Ali, Zimerman & Wolf (2024, "The Hidden Attention of Mamba Models"): one kernel
``[batch, channels, t, s]``
built from Δ, B, C and A alone, and one product with x. :func:`selective_scan` computes it that way, with
ops that hold at every length (``CumSum``, a lower-triangular ``Where``, ``Exp``, ``ReduceSum``,
``MatMul``). The kernel's first input leads back through them to the ``CumSum``: that is how the rule sets
find it (:data:`rulegraph.patterns.SCAN_KERNEL`) and hold it constant, as MambaLRP (Jafari et al.,
NeurIPS 2024) detaches Ā, B̄ and C, so the scan's relevance goes to x and none to the parameters computed
from it. Mamba2's scan (:func:`chunk_scan`) is the same with one A per head.

The cost is quadratic in the length: the exponentials are ``channels × states × length²`` numbers per
layer (Mamba-130m's 1,536 × 16 at 128 tokens: 400 M), ``heads × length²`` for Mamba2.
:func:`use_quadratic_scan` switches a loaded transformers model of the Mamba family to them, as
:func:`~rulegraph.exporters.hf.load_hf` picks eager attention.
"""
from __future__ import annotations

import inspect
import sys

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def selective_scan(hidden_states: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None,
                   z: Tensor | None = None, delta_bias: Tensor | None = None, delta_softplus: bool = False,
                   return_last_state: bool = False, **_: object) -> Tensor:
    """transformers' ``mamba_selective_scan`` (its arguments and layouts: x and Δ ``[b, d, L]``, A ``[d, n]``,
    B and C ``[b, n, L]``) in the closed form of the module docstring; with ``return_last_state`` also the state
    after the last position, h_L = Σ_s exp(A (S_L − S_s)) Δ_s B_s x_s ``[b, d, n]``."""
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    x = hidden_states.to(dt.dtype)
    S = torch.cumsum(dt, dim=-1)                                                         # [b, d, L]
    elapsed = S.unsqueeze(-1) - S.unsqueeze(-2)                                          # [b, d, t, s]: S_t − S_s
    causal = torch.ones_like(elapsed, dtype=torch.bool).tril()                          # s ≤ t
    exponent = elapsed.unsqueeze(-1) * A[None, :, None, None, :]                         # [b, d, t, s, n]
    decay = torch.exp(torch.where(causal.unsqueeze(-1), exponent, -torch.inf))
    weights = C.transpose(1, 2)[:, None, :, None, :] * (dt.unsqueeze(-1) * B.transpose(1, 2)[:, None])[:, :, None]
    kernel = (decay * weights).sum(-1)                                                   # [b, d, t, s]
    y = torch.matmul(kernel, x.unsqueeze(-1)).squeeze(-1)                               # [b, d, t]
    if D is not None:
        y = y + x * D[None, :, None]
    if z is not None:
        y = y * F.silu(z)
    if not return_last_state:
        return y.to(hidden_states.dtype)
    since = (S[..., -1:] - S).unsqueeze(-1) * A[None, :, None, :]                          # [b, d, s, n]
    last = (torch.exp(since) * dt.unsqueeze(-1) * B.transpose(1, 2)[:, None] * x.unsqueeze(-1)).sum(-2)
    return y.to(hidden_states.dtype), last


def chunk_scan(hidden_states: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int = 0,
               D: Tensor | None = None, dt_bias: Tensor | None = None, initial_states: Tensor | None = None,
               dt_softplus: bool = False, dt_limit: tuple[float, float] = (0.0, float("inf")),
               return_final_states: bool = False, **_: object) -> Tensor:
    """transformers' ``mamba2_chunk_scan`` (Mamba2's, x ``[b, L, heads, p]``, Δ ``[b, L, heads]``, A ``[heads]``,
    B and C ``[b, L, groups, n]``) in closed form: A is one number per head (Dao & Gu, ICML 2024, Sec. 3: the
    SSD layer), so the kernel is one ``[b, heads, t, s]`` matrix per head, K_{t,s} = (C_t · B_s)
    exp(A (S_t − S_s)) Δ_s, the whole sequence one chunk; ``chunk_size`` changes nothing. With
    ``return_final_states`` also the state after the last position ``[b, heads, p, n]``; an initial state (a
    cache's) is not taken."""
    if initial_states is not None:
        raise ValueError("the closed-form chunk scan takes no initial state (explain runs without a cache)")
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    batch, length, heads, p = hidden_states.shape
    groups = B.shape[2]
    # heads in groups sharing B and C: [b, groups, heads per group, …] (sizes read off the inputs, so a
    # TorchScript trace keeps the batch and the length free)
    per_group = (batch, groups, heads // groups, length)
    dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1]).transpose(1, 2).reshape(per_group)       # [b, g, r, L]
    x = hidden_states.to(dt.dtype).transpose(1, 2).reshape(*per_group, p)              # [b, g, r, L, p]
    B, C = (t.to(dt.dtype).transpose(1, 2).unsqueeze(2) for t in (B, C))              # [b, g, 1, L, n]
    A = A.to(dt.dtype).reshape(groups, heads // groups)
    S = torch.cumsum(dt, dim=-1)
    elapsed = S.unsqueeze(-1) - S.unsqueeze(-2)                                          # [b, g, r, t, s]
    causal = torch.ones_like(elapsed, dtype=torch.bool).tril()
    decay = torch.exp(torch.where(causal, elapsed * A[..., None, None], -torch.inf))
    kernel = decay * (torch.matmul(C, B.transpose(-1, -2)) * dt.unsqueeze(-2))          # [b, g, r, t, s]
    y = torch.matmul(kernel, x)                                                          # [b, g, r, L, p]
    if D is not None:
        y = y + x * D.to(dt.dtype).reshape(groups, heads // groups)[..., None, None]
    # [b, L, heads, p], laid out as transformers' scan returns it (Falcon-H1 views it as [b, L, heads·p])
    out = y.reshape(batch, heads, length, p).transpose(1, 2).contiguous().to(hidden_states.dtype)
    if not return_final_states:
        return out
    since = torch.exp((S[..., -1:] - S) * A[..., None]) * dt                             # [b, g, r, s]
    last = torch.einsum("bgrs,bgrsp,bgsn->bgrpn", since, x, B.squeeze(2))
    return out, last.reshape(batch, heads, p, -1)


#: transformers' scan functions (by the name its Mamba-family modules call) → the closed form that replaces it
SCANS = {"mamba_selective_scan": selective_scan, "mamba2_chunk_scan": chunk_scan}


def use_quadratic_scan(model: torch.nn.Module) -> bool:
    """Switch the state-space mixers of a loaded transformers ``model`` (Mamba, Mamba2 and the hybrids built
    from them: Jamba, Zamba, Bamba, Falcon-H1…) to the closed forms of :data:`SCANS`: each mixer's
    ``forward`` runs with its module's scan function replaced, and put back after the call, so other models
    in the process keep transformers' own; ``False`` if it has none."""
    mixers = [m for m in model.modules() if _scan_owner(m) is not None]
    for mixer in mixers:
        if not isinstance(mixer.forward, _Quadratic):
            mixer.forward = _Quadratic(mixer.forward, _scan_owner(mixer).__name__)
    return bool(mixers)


def restore_scan(model: torch.nn.Module) -> None:
    """Undo :func:`use_quadratic_scan`: every mixer of ``model`` runs transformers' own scan again."""
    for module in model.modules():
        if isinstance(vars(module).get("forward"), _Quadratic):
            del module.forward


def _scan_owner(module: torch.nn.Module):
    """The Python module that defines ``module``'s class, where that class is a mixer: one of its methods calls a
    scan of :data:`SCANS` that the Python module defines (``MambaMixer.slow_forward``,
    ``GraniteMoeHybridMambaLayer.forward``…); else ``None``."""
    owner = sys.modules.get(type(module).__module__)
    defined = [name for name in SCANS if callable(getattr(owner, name, None))]
    if not defined:
        return None
    called = {name for f in vars(type(module)).values() if callable(f)
              for name in getattr(getattr(inspect.unwrap(f), "__code__", None), "co_names", ())}
    return owner if called.intersection(defined) else None


class _Quadratic:
    """A mixer's ``forward`` run with the closed forms of :data:`SCANS` in place of its module's scans."""

    def __init__(self, forward, owner: str) -> None:
        self.forward, self.owner = forward, owner         # the owner by name: the model stays copyable

    def __call__(self, *args, **kwargs):
        owner = sys.modules[self.owner]
        saved = {name: getattr(owner, name) for name in SCANS if callable(getattr(owner, name, None))}
        for name in saved:
            setattr(owner, name, SCANS[name])
        try:
            return self.forward(*args, **kwargs)
        finally:
            for name, function in saved.items():
                setattr(owner, name, function)
