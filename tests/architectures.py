"""The registry of architectures the test suite explains end to end (tests/test_architectures.py).

Each :class:`Family` is a tiny random-weight model built from a ``transformers`` config, saved with
``save_pretrained`` and exported by ``rulegraph export`` (:func:`rulegraph.exporters.export_hf`), with
the rule sets it is claimed to conserve under and what it exercises. The tests check every claim:
the forward equals onnxruntime's, every claimed rule set conserves in float64, ``gi`` equals autograd
Gradient×Input, and ``rulegraph check`` agrees with ``explain``. ``docs/architectures.md`` is
rendered from this table (:func:`render`): ``RULEGRAPH_REGOLD=1`` rewrites it, and a test fails when
it is not current.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

import rulegraph
import tiny

#: the shipped rule sets for transformers and for CNNs (``models: cnns``)
TRANSFORMER_SETS = tuple(sorted(rulegraph.shipped_rule_sets()))
CNN_SETS = tuple(sorted(rulegraph.shipped_rule_sets("cnns")))
DOC = Path(__file__).resolve().parents[1] / "docs" / "architectures.md"
V = len(tiny.VOCAB)
F64 = torch.float64


@dataclass(frozen=True)
class Family:
    """One architecture: how to build it, how it is fed, what it is claimed to conserve under."""

    name: str
    title: str
    build: Callable[[], torch.nn.Module]     # seeded, eval mode
    exercises: str
    kind: str = "text"                        # "text" (token ids) or "image" (pixel values)
    rule_sets: tuple[str, ...] = TRANSFORMER_SETS
    exporters: tuple[str, ...] = ("torchscript",)
    batch: int = 1
    length: int = 8                           # tokens, special tokens included
    #: where ``gi``'s reference reads Gradient×Input: the module(s) whose outputs are the lookups, and how
    #: each call's ``[…, positions]`` scores map onto the input's positions (see :func:`embedding_gi`)
    lookups: Callable[[torch.nn.Module], list[torch.nn.Module]] = lambda m: [m.get_input_embeddings()]
    placement: str = "same"                   # same | transposed | shifted (encoder, then decoder shifted right)
    reference_dtype: torch.dtype = torch.float64
    #: ``autograd``, or ``differences`` where the Hugging Face module's own autograd disagrees with its
    #: finite differences (LeViT's does): central differences of the module at a few pixels
    reference: str = "autograd"
    #: ops the export must hold for the family to exercise what it is here for (``Op.attr=value``: with
    #: that attribute)
    ops: tuple[str, ...] = ()
    note: str = ""
    #: the start of the ``ExportError`` `rulegraph export` refuses the family with (its export check finds
    #: no exporter whose graph computes what the module computes at other input sizes); "" where it exports
    refused: str = ""


def _seeded(make: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return make().eval()
    return build


def _he(model: torch.nn.Module) -> torch.nn.Module:
    """Unit-scale activations for the image models (Hugging Face initialises near zero: logits ~1e-20)."""
    for mod in model.modules():
        if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)):
            mod.weight.data.normal_(0.0, (2.0 / mod.weight[0].numel()) ** 0.5)
            if mod.bias is not None:
                mod.bias.data.uniform_(-0.1, 0.1)
    return model


def _text(config_class: str, model_class: str, **config):
    def make():
        import transformers
        return getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
    return _seeded(make)


def _image(config_class: str, model_class: str, **config):
    def make():
        import transformers
        return _he(getattr(transformers, model_class)(getattr(transformers, config_class)(**config)))
    return _seeded(make)


LABELS = {"id2label": {0: "negative", 1: "positive"}, "label2id": {"negative": 0, "positive": 1}}
IMAGE_LABELS = {"id2label": {0: "a", 1: "b", 2: "c"}, "label2id": {"a": 0, "b": 1, "c": 2}}
SMALL = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)

FAMILIES: tuple[Family, ...] = (
    Family("xlnet", "XLNet", _text("XLNetConfig", "XLNetForSequenceClassification", vocab_size=V, d_model=16, n_layer=1,
                                   n_head=2, d_inner=32, pad_token_id=0, bos_token_id=2, eos_token_id=3, **LABELS),
           "ids transposed to [positions, batch] before the lookup; EyeLike; relative attention",
           placement="transposed", ops=("Transpose", "EyeLike")),
    Family("canine", "CANINE", _text("CanineConfig", "CanineForSequenceClassification", **SMALL,
                                     max_position_embeddings=64, num_hash_functions=4, num_hash_buckets=64,
                                     downsampling_rate=2, upsampling_kernel_size=2, local_transformer_stride=4,
                                     pad_token_id=0, **LABELS),
           "code points hashed into 4 tables ((id + 1)·p mod B), downsampling convolution",
           lookups=lambda m: [m.canine.char_embeddings.get_submodule(f"HashBucketCodepointEmbedder_{k}")
                              for k in range(4)],
           # Hugging Face's CANINE gives NaN in float64 (a float32 mask minimum): the reference runs in float32
           reference_dtype=torch.float32, ops=("Mod",)),
    # two layers: the global-attention indices are computed once and shared through a tensor sequence
    Family("longformer", "Longformer", _text("LongformerConfig", "LongformerForSequenceClassification", vocab_size=V,
                                             **{**SMALL, "num_hidden_layers": 2}, max_position_embeddings=66,
                                             attention_window=4, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                                             **LABELS),
           "SplitToSequence / SequenceAt (global-attention indices), ScatterND, sliding-window chunks",
           batch=2, rule_sets=(), note="Longformer: refused by `rulegraph export`. The TorchScript export bakes in "
                         "the traced batch and a length that is a multiple of the attention window (its Reshapes fail "
                         "at other sizes, which the export check runs), and the dynamo exporter cannot export it",
           refused="no export computes what the module computes"),
    Family("bloom", "Bloom", _text("BloomConfig", "BloomForSequenceClassification", vocab_size=V, hidden_size=16,
                                   n_layer=1, n_head=2, pad_token_id=0, bos_token_id=2, eos_token_id=3, **LABELS),
           "ALiBi position biases added to the attention scores"),
    Family("convbert", "ConvBERT", _text("ConvBertConfig", "ConvBertForSequenceClassification", vocab_size=V,
                                         **SMALL, max_position_embeddings=64, embedding_size=16, head_ratio=2,
                                         conv_kernel_size=3, pad_token_id=0, **LABELS),
           "dynamic-convolution attention: softmax(W·x) as the second factor of a product", ops=("Conv",)),
    Family("gemma2", "Gemma 2", _text("Gemma2Config", "Gemma2ForCausalLM", vocab_size=V, hidden_size=16,
                                      intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, head_dim=8, max_position_embeddings=64, pad_token_id=0,
                                      bos_token_id=None, eos_token_id=None, sliding_window=4,
                                      final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                                      attn_implementation="eager"),
           "tanh soft-capping of the logits and of the attention scores, sliding-window layers", ops=("Tanh",)),
    Family("mamba", "Mamba", _text("MambaConfig", "MambaForCausalLM", vocab_size=V, hidden_size=16, num_hidden_layers=2,
                                   state_size=4, expand=2, conv_kernel=3, time_step_rank=2, pad_token_id=0,
                                   bos_token_id=None, eos_token_id=None),
           "the selective scan in closed form (exporters/ssm.py: CumSum, a causal Where, Exp, the kernel's product "
           "with x), a causal depthwise convolution, SiLU gate", ops=("CumSum", "Trilu", "Conv", "Softplus")),
    Family("mamba2", "Mamba2", _text("Mamba2Config", "Mamba2ForCausalLM", vocab_size=V, hidden_size=16,
                                     num_hidden_layers=2, state_size=4, expand=2, conv_kernel=3, num_heads=4,
                                     head_dim=8, n_groups=1, chunk_size=4, pad_token_id=0, bos_token_id=None,
                                     eos_token_id=None),
           "the SSD scan in closed form (one kernel per head), a gated RMSNorm", ops=("CumSum", "Trilu", "Conv")),
    Family("jamba", "Jamba (Mamba + attention + experts)", _text(
        "JambaConfig", "JambaForCausalLM", vocab_size=V, hidden_size=16, num_hidden_layers=2, intermediate_size=32,
        num_attention_heads=2, num_key_value_heads=1, mamba_d_state=4, mamba_d_conv=3, mamba_expand=2,
        mamba_dt_rank=2, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
        num_experts=2, use_mamba_kernels=False, pad_token_id=0, bos_token_id=None, eos_token_id=None,
        attn_implementation="eager", experts_implementation="eager"),     # grouped_mm takes no float64
           "a hybrid: a Mamba layer, then an attention layer with a mixture of experts",
           # Hugging Face's Jamba computes its RMSNorms in float32 even in a float64 module (1.5e-4 of the largest
           # score here; 8.5e-11 with the norms in float64): the reference runs in float32
           reference_dtype=torch.float32, ops=("CumSum", "Softmax", "ScatterElements")),
    Family("bart-cls", "BART sequence classifier", _text(
        "BartConfig", "BartForSequenceClassification", vocab_size=V, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=64, pad_token_id=0, bos_token_id=2, eos_token_id=3, decoder_start_token_id=3,
        forced_eos_token_id=None, **LABELS),
           "the decoder's ids shifted right from input_ids behind a start token; the eos-count check",
           lookups=lambda m: [m.model.encoder.embed_tokens, m.model.decoder.embed_tokens], placement="shifted", ops=("ScatterND", "NonZero", "GatherND")),
    Family("t5-cls", "T5 sequence classifier", _text(
        "T5Config", "T5ForSequenceClassification", vocab_size=V, d_model=16, d_kv=8, d_ff=32, num_layers=1,
        num_decoder_layers=1, num_heads=2, pad_token_id=0, eos_token_id=3, decoder_start_token_id=0, **LABELS),
           "as BART's, with relative position buckets and RMSNorm", placement="shifted",
           lookups=lambda m: [m.transformer.encoder.embed_tokens, m.transformer.decoder.embed_tokens], ops=("ScatterND", "NonZero", "GatherND")),
    Family("dinov2", "DINOv2", _image("Dinov2Config", "Dinov2ForImageClassification", hidden_size=16,
                                      num_hidden_layers=1, num_attention_heads=2, mlp_ratio=2, image_size=16,
                                      patch_size=4, **IMAGE_LABELS),
           "bicubic interpolation of the position embeddings (Resize cubic), layer scale", kind="image",
           rule_sets=TRANSFORMER_SETS + CNN_SETS, ops=("Resize.mode=cubic",)),
    Family("convnext", "ConvNeXt", _image("ConvNextConfig", "ConvNextForImageClassification", num_channels=3,
                                          num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], image_size=16,
                                          patch_size=2, **IMAGE_LABELS),
           "channels-last LayerNormalization, Erf GELU, layer-scale Mul", kind="image", exporters=("torchscript", "dynamo"),
           rule_sets=TRANSFORMER_SETS + CNN_SETS, ops=("LayerNormalization", "Erf")),
    Family("poolformer", "PoolFormer", _image("PoolFormerConfig", "PoolFormerForImageClassification", num_channels=3,
                                              hidden_sizes=[8, 16], depths=[1, 1], num_encoder_blocks=2,
                                              patch_sizes=[3, 3], strides=[2, 2], padding=[1, 1], image_size=16,
                                              mlp_ratio=2.0, **IMAGE_LABELS),
           "GroupNorm exported as InstanceNormalization, pool(x) − x, layer scale", kind="image",
           rule_sets=TRANSFORMER_SETS + CNN_SETS, ops=("InstanceNormalization", "AveragePool")),
    Family("mobilevit", "MobileViT", _image("MobileViTConfig", "MobileViTForImageClassification", num_channels=3,
                                            image_size=32, patch_size=2, hidden_sizes=[8, 8, 8], expand_ratio=2.0,
                                            neck_hidden_sizes=[4, 4, 8, 8, 8, 8, 16], num_attention_heads=2,
                                            mlp_ratio=2.0, **IMAGE_LABELS),
           "attention blocks inside a CNN, SiLU as x·σ(x), Resize", kind="image",
           rule_sets=TRANSFORMER_SETS + CNN_SETS, ops=("Softmax", "Sigmoid")),
    Family("levit", "LeViT", _image("LevitConfig", "LevitForImageClassification", image_size=32, num_channels=3,
                                    patch_size=16, hidden_sizes=[16, 24], num_attention_heads=[2, 2], depths=[1, 1],
                                    key_dim=[8, 8], drop_path_rate=0, mlp_ratio=[2, 2], attention_ratio=[2, 2],
                                    down_ops=[["Subsample", 8, 2, 2, 2, 2]], **IMAGE_LABELS),
           "attention with a learned bias inside a CNN, HardSwish, an unfolded BatchNorm before the head", kind="image",
           rule_sets=TRANSFORMER_SETS + CNN_SETS, reference="differences", ops=("Softmax", "HardSwish", "BatchNormalization")),
)
BY_NAME = {f.name: f for f in FAMILIES}


def export(family: Family, folder: Path, exporter: str = "torchscript") -> tuple[torch.nn.Module, Path]:
    """The family's model saved with ``save_pretrained`` (and a tokenizer for text) and exported as
    ``rulegraph export --exporter EXPORTER`` does; returns the module and the ONNX path."""
    from rulegraph.exporters import export_hf
    module = family.build()
    module.save_pretrained(folder / "hf")
    if family.kind == "text":
        tiny.tokenizer().save(str(folder / "hf" / "tokenizer.json"))
    return module, export_hf(folder / "hf", folder / exporter, exporter=exporter)


def feeds(family: Family, path: Path) -> dict[str, torch.Tensor]:
    """The inputs the family is explained on: a text of ``length`` tokens (``[CLS] w… [SEP]``, the [SEP]
    being the eos of the encoder–decoder classifiers) repeated ``batch`` times with different words; or
    seeded pixels."""
    graph = rulegraph.load(str(path))
    if family.kind == "image":
        g = torch.Generator().manual_seed(1)
        return {"pixel_values": torch.randn(family.batch, *graph.inputs[0].shape[1:], generator=g)}
    rows = []
    for b in range(family.batch):
        text = " ".join(tiny.VOCAB[5 + (7 * b + 3 * i) % (V - 5)] for i in range(family.length - 2))
        rows.append(rulegraph.encode(str(path), text).inputs)
    return {i.name: torch.cat([r[i.name] for r in rows]) for i in graph.inputs}


def embedding_gi(family: Family, module: torch.nn.Module, inputs: dict[str, torch.Tensor], target: int,
                 position: int | None = None) -> torch.Tensor:
    """Gradient×Input at the token lookups by autograd, ``[batch, positions]`` of ``input_ids``: each
    call of the family's lookup modules gives (output ⊙ gradient) summed over its row; ``placement``
    maps the calls onto the input's positions (``transposed``: the module saw [positions, batch];
    ``shifted``: the second call read the ids shifted right behind a start token, so its position k is
    the input's k − 1, and its position 0 is no input's)."""
    import copy
    model = copy.deepcopy(module).to(family.reference_dtype)
    caught: list[torch.Tensor] = []

    def hook(mod, args, out):
        out.retain_grad()
        caught.append(out)
    modules = list({id(m): m for m in family.lookups(model)}.values())     # T5's encoder and decoder share one
    handles = [m.register_forward_hook(hook) for m in modules]
    try:
        out = model(**inputs).logits
        picked = out[:, -1] if out.dim() == 3 else out
        picked[0, target].backward()
    finally:
        for h in handles:
            h.remove()
    scores = [(c * c.grad).sum(-1).detach().double() for c in caught]
    if family.placement == "transposed":
        return sum(s.T for s in scores)
    if family.placement == "shifted":
        encoder, decoder = scores
        total = encoder.clone()
        total[:, :-1] += decoder[:, 1:]
        return total
    return sum(scores)


def pixel_gi(family: Family, module: torch.nn.Module, inputs: dict[str, torch.Tensor],
             target: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x ⊙ ∂logit/∂x at the pixels of item 0, summed over the channels, in float64: by autograd, or
    (``reference="differences"``) by central differences at a few pixels; returns the scores and the
    mask of the pixels they hold (``None``: all)."""
    import copy
    model = copy.deepcopy(module).double()
    x = inputs["pixel_values"][:1].double()
    if family.reference == "autograd":
        x.requires_grad_(True)
        model(pixel_values=x).logits[0, target].backward()
        return (x * x.grad).sum(1).detach(), None
    scores, mask = torch.zeros(x.shape[0], *x.shape[2:], dtype=F64), torch.zeros(x.shape[0], *x.shape[2:], dtype=torch.bool)
    g = torch.Generator().manual_seed(2)
    h = 1e-5
    with torch.no_grad():
        for _ in range(6):
            i, j = (int(torch.randint(n, (1,), generator=g)) for n in x.shape[2:])
            for c in range(x.shape[1]):
                step = torch.zeros_like(x)
                step[0, c, i, j] = h
                slope = (model(pixel_values=x + step).logits[0, target] - model(pixel_values=x - step).logits[0, target]) / (2 * h)
                scores[0, i, j] += x[0, c, i, j] * slope
            mask[0, i, j] = True
    return scores, mask


def render() -> str:
    """docs/architectures.md from :data:`FAMILIES`: one row per family, the rule sets it conserves under."""
    sets = TRANSFORMER_SETS + CNN_SETS
    lines = [
        "# Architectures tested",
        "",
        "Generated from `tests/architectures.py` by the test suite: `RULEGRAPH_REGOLD=1 pytest",
        "tests/test_architectures.py` rewrites it, and a test fails when it is out of date. Each family is a",
        "tiny random-weight model built from its `transformers` config, saved with `save_pretrained` and",
        "exported by `rulegraph export` with each exporter shown. For every export the tests check that the",
        "forward equals onnxruntime's, that `gi` equals autograd Gradient×Input (mapped back to the input's",
        "positions), that `rulegraph check` agrees with `explain`, and, under each rule set marked ✓, that",
        "relevance is conserved in float64 (relative error ≤ 1e-10, no unexpected break). Under a rule set",
        "left blank (the CNN sets on token models: their boundary is a float input) `check` and `explain`",
        "both refuse the model. Other families (BERT, RoBERTa, DistilBERT, GPT-2, Llama, Qwen, Mistral, Gemma,",
        "BART/T5/Marian LMs, ViT, ResNet, VGG, MobileNetV3, EfficientNet; the audio classifiers Wav2Vec2, HuBERT",
        "and Whisper, `tests/exporters/test_audio_export.py`; the state-space models Falcon-Mamba, Bamba,",
        "Zamba2, Falcon-H1, GraniteMoeHybrid and NemotronH, `tests/exporters/test_ssm.py`) are covered by their",
        "own test modules.",
        "",
        "**State-space models** (Mamba, Mamba2 and the hybrids built from them): `rulegraph export` writes",
        "their selective scan in closed form, y = K·x with the kernel K computed from Δ, B, C and A",
        "(`exporters/ssm.py`), so the graph holds at every length. Every relevance rule set holds K",
        "constant (the `selective-scan-kernel` pattern), as MambaLRP (Jafari et al., NeurIPS 2024) detaches",
        "Ā, B̄ and C: under `attnlrp` (SiLU's gate held, RMSNorm's scale held, the gate's product split in",
        "half) an explanation of a Mamba or a Mamba2 equals MambaLRP's, to 2e-11 and 3e-12 in float64",
        "(`tests/exporters/test_ssm.py`).",
        "The closed form costs channels × states × length² numbers per Mamba layer (Mamba2: heads × length²).",
        "",
        "**Vision–language models** (Gemma 3 and InternVL, `tests/exporters/test_vlm.py`): image patches and text",
        "tokens in one sequence, exported as task `image-text-to-text`; every relevance rule set above conserves",
        "over the tokens and the pixels together, and `gi` equals autograd Gradient×Input at both. LLaVA is",
        "refused at export (its image features are split per picture at the traced batch).",
        "",
        "**Speech to text** (Whisper, `tests/exporters/test_speech.py`): exported as task `speech-seq2seq`",
        "(log-mel features and the decoder's ids in); every relevance rule set above conserves over the",
        "features and the target prefix, `gi` equals autograd Gradient×Input at both, and a generation's matrix",
        "holds the clip as spans of time (`rulegraph explain --audio FILE.wav --generate N`).",
        "",
        "| family | exporter | " + " | ".join(sets) + " | exercises |",
        "|---|---|" + "---|" * len(sets) + "---|",
    ]
    notes = []
    for f in FAMILIES:
        marks = ["✓" if s in f.rule_sets else "" for s in sets]
        mark = ""
        if f.note:
            notes.append(f.note)
            mark = f" [{len(notes)}]"
        exercises = f"refused at export: {f.refused}" if f.refused else f.exercises
        lines.append(f"| {f.title}{mark} | {', '.join(f.exporters)} | " + " | ".join(marks) + f" | {exercises} |")
    lines += ["", *(f"[{i}] {note}." for i, note in enumerate(notes, 1))] if notes else []
    return "\n".join(lines) + "\n"
