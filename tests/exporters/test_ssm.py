"""State-space models (exporters/ssm.py): the closed-form scans equal the recurrence, written here step by
step in float64, with the state after the last position; a loaded Mamba-family model is switched to them
and no other model is; the export of Mamba-family models other than tests/architectures.py's conserves;
and `attnlrp` on an exported Mamba or Mamba2 is MambaLRP (Jafari et al., NeurIPS 2024): it equals the paper's
implementation trick, Gradient×Input through the model with SiLU's sigmoid, RMSNorm's scale, Ā, B̄ and C
detached and the gate's product split half and half, written here over the module's weights."""
from __future__ import annotations

import copy
import sys

import pytest
import torch
import torch.nn.functional as F

import rulegraph
import tiny
from architectures import BY_NAME, export, feeds
from rulegraph.dryrun import dry_run
from rulegraph.exporters.ssm import chunk_scan, selective_scan, use_quadratic_scan
from rulegraph.patterns import SCAN_KERNEL

F64 = torch.float64
transformers = pytest.importorskip("transformers")


def _mamba_recurrence(x, dt, A, B, C, D, z, bias):
    """Mamba's scan (Gu & Dao 2023, Alg. 2) one position at a time: x, Δ ``[b, d, L]``, B, C ``[b, n, L]``."""
    dt = F.softplus(dt + bias[:, None])
    h = torch.zeros(x.shape[0], x.shape[1], A.shape[1], dtype=F64)
    ys = []
    for t in range(x.shape[-1]):
        h = torch.exp(A * dt[:, :, t, None]) * h + dt[:, :, t, None] * B[:, None, :, t] * x[:, :, t, None]
        ys.append((h * C[:, None, :, t]).sum(-1))
    return (torch.stack(ys, -1) + D[:, None] * x) * F.silu(z), h


def _mamba2_recurrence(x, dt, A, B, C, D, bias):
    """Mamba2's scan one position at a time: x ``[b, L, heads, p]``, Δ ``[b, L, heads]``, B, C ``[b, L, groups, n]``."""
    dt = F.softplus(dt + bias)
    repeat = x.shape[2] // B.shape[2]
    B, C = B.repeat_interleave(repeat, 2), C.repeat_interleave(repeat, 2)
    h = torch.zeros(x.shape[0], x.shape[2], x.shape[3], B.shape[-1], dtype=F64)
    ys = []
    for t in range(x.shape[1]):
        h = torch.exp(A * dt[:, t])[..., None, None] * h + (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, :, None]
        ys.append((h * C[:, t, :, None]).sum(-1))
    return torch.stack(ys, 1) + D[:, None] * x, h


@pytest.mark.parametrize("length", [1, 2, 7, 13])
def test_the_closed_form_scans_equal_the_recurrence(length):
    g = torch.Generator().manual_seed(length)
    b, d, n = 2, 6, 3
    x, dt, z = (torch.randn(b, d, length, generator=g, dtype=F64) for _ in range(3))
    A = -torch.rand(d, n, generator=g, dtype=F64) * 2
    B, C = (torch.randn(b, n, length, generator=g, dtype=F64) for _ in range(2))
    D, bias = torch.randn(d, generator=g, dtype=F64), torch.randn(d, generator=g, dtype=F64)
    y, last = selective_scan(x, dt, A, B, C, D, z=z, delta_bias=bias, delta_softplus=True, return_last_state=True)
    expected, state = _mamba_recurrence(x, dt, A, B, C, D, z, bias)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(last, state, rtol=1e-12, atol=1e-12)

    heads, p, groups = 4, 2, 2
    x = torch.randn(b, length, heads, p, generator=g, dtype=F64)
    dt = torch.randn(b, length, heads, generator=g, dtype=F64)
    A, D, bias = (torch.randn(heads, generator=g, dtype=F64) for _ in range(3))
    A = -A.abs()
    B, C = (torch.randn(b, length, groups, n, generator=g, dtype=F64) for _ in range(2))
    y, last = chunk_scan(x, dt, A, B, C, chunk_size=4, D=D, dt_bias=bias, dt_softplus=True, return_final_states=True)
    expected, state = _mamba2_recurrence(x, dt, A, B, C, D, bias)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(last, state, rtol=1e-12, atol=1e-12)


#: Mamba-family causal LMs beyond tests/architectures.py's Mamba, Mamba2 and Jamba: config → LM class, options
OTHERS = {
    "falcon_mamba": ("FalconMambaConfig", "FalconMambaForCausalLM",
                     dict(state_size=4, expand=2, conv_kernel=3, time_step_rank=2)),
    "bamba": ("BambaConfig", "BambaForCausalLM",
              dict(intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, mamba_n_heads=4,
                   mamba_d_head=8, mamba_d_state=4, mamba_d_conv=3, mamba_expand=2, mamba_chunk_size=4,
                   attn_layer_indices=[1], attn_implementation="eager")),
    "zamba2": ("Zamba2Config", "Zamba2ForCausalLM",
               dict(intermediate_size=32, num_attention_heads=2, num_key_value_heads=2, mamba_d_state=4,
                    mamba_d_conv=3, mamba_expand=2, mamba_headdim=8, n_mamba_heads=4, mamba_ngroups=1, chunk_size=4,
                    layers_block_type=["mamba", "hybrid"], hybrid_layer_ids=[1], attn_implementation="eager")),
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM",          # attention and Mamba2 side by side in a layer
                  dict(intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8, mamba_d_ssm=32,
                       mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=1, mamba_d_state=4, mamba_d_conv=3,
                       mamba_expand=2, mamba_chunk_size=4, attn_implementation="eager")),
    "granitemoehybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",    # its mixer: …MambaLayer
                         dict(intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, num_local_experts=2,
                              num_experts_per_tok=1, shared_intermediate_size=32, mamba_n_heads=4, mamba_d_head=8,
                              mamba_n_groups=1, mamba_d_state=4, mamba_d_conv=3, mamba_expand=2, mamba_chunk_size=4,
                              layer_types=["mamba", "attention"], attn_implementation="eager")),
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM",
                   dict(intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                        mamba_num_heads=4, mamba_head_dim=8, n_groups=1, ssm_state_size=4, conv_kernel=3, expand=2,
                        chunk_size=4, hybrid_override_pattern="M*", attn_implementation="eager")),
}


def _other(kind: str) -> torch.nn.Module:
    config, model, extra = OTHERS[kind]
    torch.manual_seed(0)
    return getattr(transformers, model)(getattr(transformers, config)(
        vocab_size=len(tiny.VOCAB), hidden_size=16, num_hidden_layers=2, pad_token_id=0, bos_token_id=None,
        eos_token_id=None, **extra)).eval()


@pytest.mark.parametrize("kind", sorted(OTHERS))
def test_a_switched_model_computes_what_it_did_and_others_keep_their_loop(kind):
    module = _other(kind)
    ids = torch.randint(5, len(tiny.VOCAB), (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = module(input_ids=ids, use_cache=False).logits
        switched = copy.deepcopy(module)
        assert use_quadratic_scan(switched)
        owner = sys.modules[type(module).__module__]
        scans = {name: getattr(owner, name, None) for name in ("mamba_selective_scan", "mamba2_chunk_scan")}
        after = switched(input_ids=ids, use_cache=False).logits
        assert {name: getattr(owner, name, None) for name in scans} == scans     # put back after the call
        torch.testing.assert_close(module(input_ids=ids, use_cache=False).logits, before, rtol=0, atol=0)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)       # transformers' scans run in float32


def test_a_model_without_a_scan_is_left_alone():
    module = tiny.causal_lm("llama")
    assert not use_quadratic_scan(module)
    assert "forward" not in vars(module.model.layers[0].self_attn)


@pytest.mark.parametrize("kind", sorted(OTHERS))
def test_other_mamba_families_export_and_conserve(kind, tmp_path):
    """Exported (the export check runs them at two other lengths), every op runs and `attnlrp` holds the
    scan's kernel (the `selective-scan-kernel` entry) and conserves in float64."""
    module = _other(kind)
    module.save_pretrained(tmp_path / "hf")
    tiny.lm_tokenizer().save(str(tmp_path / "hf" / "tokenizer.json"))
    path = rulegraph.exporters.export_hf(tmp_path / "hf", tmp_path / "out")
    run = dry_run(str(path), "attnlrp", dtype=F64)
    assert run.ok, [str(g) for g in run.gaps]
    kernels = [n for n in run.graph.nodes if n.op == "MatMul" and SCAN_KERNEL.matches(run.graph, n.inputs[0])]
    assert kernels and all(run.binding.assignments[n.name].rule.name == "ah" for n in kernels)
    for e in run.explanations.values():
        assert e.audit.conservation.relative_error <= 1e-10


def _rms(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """RMSNorm with its scale 1/√(mean x² + ε) detached (MambaLRP's normalization rule)."""
    return norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon).detach())


def _silu(x: torch.Tensor) -> torch.Tensor:
    """x · σ(x) with σ detached (MambaLRP's SiLU rule)."""
    return x * torch.sigmoid(x).detach()


def _mixer(mixer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A Mamba mixer over x ``[b, L, H]`` as MambaLRP propagates through it: the scan one position at a time
    with Ā = exp(Δ A), B̄ = Δ B and C detached; the gate y · SiLU(z) split half and half."""
    u, z = mixer.in_proj(x).transpose(1, 2).chunk(2, dim=1)
    length = u.shape[-1]
    u = _silu(mixer.conv1d(u)[..., :length])
    dt, B, C = torch.split(mixer.x_proj(u.transpose(1, 2)),
                           [mixer.time_step_rank, mixer.ssm_state_size, mixer.ssm_state_size], dim=-1)
    dt = F.softplus(mixer.dt_proj(dt)).transpose(1, 2)                                   # [b, d, L]
    A = -torch.exp(mixer.A_log)
    h = torch.zeros(u.shape[0], u.shape[1], A.shape[1], dtype=u.dtype)
    ys = []
    for t in range(length):
        decay = torch.exp(A * dt[:, :, t, None]).detach()
        into = (dt[:, :, t, None] * B[:, None, t, :]).detach()
        h = decay * h + into * u[:, :, t, None]
        ys.append((h * C[:, None, t, :].detach()).sum(-1))
    y = torch.stack(ys, -1) + u * mixer.D[None, :, None]
    product = y * _silu(z)
    y = 0.5 * product + 0.5 * product.detach()
    return mixer.out_proj(y.transpose(1, 2))


def _mixer2(mixer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A Mamba2 mixer as MambaLRP propagates through it: the SSD scan one position at a time with exp(Δ A), Δ B
    and C detached, the gated RMSNorm's product y · SiLU(z) split half and half and its scale detached."""
    z, xbc, dt = mixer.in_proj(x).split([mixer.intermediate_size, mixer.conv_dim, mixer.num_heads], dim=-1)
    length = xbc.shape[1]
    xbc = _silu(mixer.conv1d(xbc.transpose(1, 2))[..., :length].transpose(1, 2))
    states = mixer.n_groups * mixer.ssm_state_size
    u, B, C = torch.split(xbc, [mixer.intermediate_size, states, states], dim=-1)
    heads, p = mixer.num_heads, mixer.head_dim
    u = u.unflatten(-1, (heads, p))                                                       # [b, L, h, p]
    B, C = (t.unflatten(-1, (mixer.n_groups, -1)).repeat_interleave(heads // mixer.n_groups, 2) for t in (B, C))
    dt = F.softplus(dt + mixer.dt_bias)                                                  # [b, L, h]
    A = -torch.exp(mixer.A_log)
    h = torch.zeros(u.shape[0], heads, p, mixer.ssm_state_size, dtype=u.dtype)
    ys = []
    for t in range(length):
        decay = torch.exp(A * dt[:, t])[..., None, None].detach()
        into = (dt[:, t, :, None, None] * B[:, t, :, None, :]).detach()
        h = decay * h + into * u[:, t, :, :, None]
        ys.append((h * C[:, t, :, None, :].detach()).sum(-1))
    y = (torch.stack(ys, 1) + mixer.D[:, None] * u).flatten(2)                          # [b, L, h·p]
    product = y * _silu(z)
    gated = 0.5 * product + 0.5 * product.detach()
    grouped = gated.unflatten(-1, (mixer.n_groups, -1))
    scale = torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + mixer.norm.variance_epsilon).detach()
    return mixer.out_proj(mixer.norm.weight * (grouped * scale).flatten(2))


def mambalrp(module: torch.nn.Module, ids: torch.Tensor, target: int) -> torch.Tensor:
    """MambaLRP's relevance of each token for ``target`` at the last position, float64: Gradient×Input at the
    embeddings through the detached model above (a Mamba's or a Mamba2's mixers)."""
    model = copy.deepcopy(module).double()
    embedded = model.backbone.embeddings(ids).detach().requires_grad_(True)
    h = embedded
    mixer = _mixer2 if model.config.model_type == "mamba2" else _mixer
    for layer in model.backbone.layers:
        h = h + mixer(layer.mixer, _rms(layer.norm, h))
    logits = model.lm_head(_rms(model.backbone.norm_f, h))
    logits[0, -1, target].backward()
    return (embedded * embedded.grad).sum(-1).detach()


@pytest.mark.parametrize("name", ["mamba", "mamba2"])
def test_attnlrp_on_mamba_is_mambalrp(name, tmp_path):
    family = BY_NAME[name]
    module, path = export(family, tmp_path)
    inputs = feeds(family, path)
    e = rulegraph.explain(str(path), "attnlrp", inputs, dtype=F64)
    expected = mambalrp(module, inputs["input_ids"], e.target[0])
    got = e.relevance["input_ids"]
    assert float(expected.abs().max()) > 1e-3
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10 * float(expected.abs().max()))
    assert e.audit.conservation.relative_error <= 1e-10
    naive = rulegraph.explain(str(path), "gi", inputs, dtype=F64).relevance["input_ids"]
    assert (naive - expected).abs().max() > 1e-3 * expected.abs().max()        # the rules make a difference


@pytest.mark.parametrize("name", ["mamba", "mamba2"])
def test_a_model_in_memory_is_explained_as_its_export(name, tmp_path):
    """The Python API captures a model in memory with torch.export (the fx loader: softplus, the scan's
    closed form) and explains it as its ONNX export; the model is left running transformers' own scan."""
    family = BY_NAME[name]
    module, path = export(family, tmp_path)
    inputs = feeds(family, path)
    from_file = rulegraph.explain(str(path), "attnlrp", inputs, dtype=F64)
    in_memory = rulegraph.explain(module, "attnlrp", inputs, dtype=F64)
    torch.testing.assert_close(in_memory.relevance["input_ids"], from_file.relevance["input_ids"],
                               rtol=1e-10, atol=1e-12)
    assert not any("forward" in vars(m) for m in module.modules())
