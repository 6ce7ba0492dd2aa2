"""Tiny random-weight models and a word-level tokenizer, built in the tests (no network).

Shared by the test modules: ``tiny.build("bert")`` gives a seeded
BertForSequenceClassification with hidden size 32; ``tiny.onnx(...)`` exports one.
"""
from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors

VOCAB = ["[PAD]", "<pad>", "[CLS]", "[SEP]", "[UNK]"] + [f"w{i}" for i in range(95)]
SIZE = dict(hidden=32, layers=2, heads=4, ffn=64, positions=64)


def _bert(attention: str) -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification
    config = BertConfig(
        vocab_size=len(VOCAB), hidden_size=SIZE["hidden"], num_hidden_layers=SIZE["layers"],
        num_attention_heads=SIZE["heads"], intermediate_size=SIZE["ffn"], max_position_embeddings=SIZE["positions"],
        pad_token_id=0, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1},
        attn_implementation=attention,
    )
    return BertForSequenceClassification(config)


def _gpt2(attention: str) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2ForSequenceClassification
    config = GPT2Config(
        vocab_size=len(VOCAB), n_embd=SIZE["hidden"], n_layer=SIZE["layers"], n_head=SIZE["heads"],
        n_positions=SIZE["positions"], num_labels=3, pad_token_id=0, bos_token_id=2, eos_token_id=3,
        attn_implementation=attention,
    )
    return GPT2ForSequenceClassification(config)


def _distilbert(attention: str) -> torch.nn.Module:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    config = DistilBertConfig(
        vocab_size=len(VOCAB), dim=SIZE["hidden"], n_layers=SIZE["layers"], n_heads=SIZE["heads"],
        hidden_dim=SIZE["ffn"], max_position_embeddings=SIZE["positions"], pad_token_id=0,
        attn_implementation=attention,
    )
    return DistilBertForSequenceClassification(config)


def _roberta(attention: str) -> torch.nn.Module:
    from transformers import RobertaConfig, RobertaForSequenceClassification
    config = RobertaConfig(
        vocab_size=len(VOCAB), hidden_size=SIZE["hidden"], num_hidden_layers=SIZE["layers"],
        num_attention_heads=SIZE["heads"], intermediate_size=SIZE["ffn"], max_position_embeddings=SIZE["positions"] + 2,
        type_vocab_size=1, pad_token_id=1, bos_token_id=2, eos_token_id=3, attn_implementation=attention,
    )
    return RobertaForSequenceClassification(config)


def causal_lm(kind: str, *, seed: int = 0) -> torch.nn.Module:
    """A seeded tiny decoder-only LM with its LM head: GPT-2, or a :data:`LLAMA_STYLE` family (RMSNorm,
    rotary positions, SwiGLU, grouped-query attention: 4 query heads, 2 key/value heads). No
    end-of-text token, so greedy generation runs for as many steps as asked."""
    import transformers
    torch.manual_seed(seed)
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=len(VOCAB), n_embd=SIZE["hidden"], n_layer=SIZE["layers"],
                                         n_head=SIZE["heads"], n_positions=SIZE["positions"], bos_token_id=None,
                                         eos_token_id=None, attn_implementation="eager")
        return transformers.GPT2LMHeadModel(config).eval()
    config_class, model_class = LLAMA_STYLE[kind]
    extra = {"head_dim": SIZE["hidden"] // SIZE["heads"]} if kind.startswith("gemma") else {}
    config = getattr(transformers, config_class)(
        vocab_size=len(VOCAB), hidden_size=SIZE["hidden"], intermediate_size=SIZE["ffn"],
        num_hidden_layers=SIZE["layers"], num_attention_heads=SIZE["heads"], num_key_value_heads=2,
        max_position_embeddings=SIZE["positions"], pad_token_id=0, bos_token_id=None, eos_token_id=None,
        attn_implementation="eager", **extra)
    return getattr(transformers, model_class)(config).eval()


#: Llama-style families (RMSNorm, rotary positions, gated MLP, grouped-query attention) → their
#: transformers config and causal-LM classes. Qwen3 adds an RMSNorm on each head's queries and keys;
#: Gemma scales the embeddings by √hidden, its RMSNorm multiplies by (1 + w) and its MLP gates with
#: tanh-GELU; Gemma 3 adds Qwen3's query/key norms and a norm after attention and after the MLP.
LLAMA_STYLE = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM"), "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
}


#: top-k-routed mixture-of-experts causal LMs: name → (config class, causal-LM class, the config's
#: expert-count and expert-size keywords); 4 experts, 2 per token
MOE = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_experts=4, moe_intermediate_size=16, decoder_sparse_step=1, norm_topk_prob=True)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, intermediate_size=16)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(num_experts=4, intermediate_size=16)),
}


def moe_lm(kind: str, *, seed: int = 0) -> torch.nn.Module:
    """A seeded tiny mixture-of-experts causal LM of :data:`MOE` (4 experts, top-2 routing, 2 layers,
    grouped-query attention) in eval mode, with transformers' own experts implementation."""
    import transformers
    torch.manual_seed(seed)
    config_class, model_class, experts = MOE[kind]
    config = getattr(transformers, config_class)(
        vocab_size=len(VOCAB), hidden_size=SIZE["hidden"], num_hidden_layers=SIZE["layers"],
        num_attention_heads=SIZE["heads"], num_key_value_heads=2, num_experts_per_tok=2,
        max_position_embeddings=SIZE["positions"], pad_token_id=0, bos_token_id=None, eos_token_id=None,
        attn_implementation="eager", **experts)
    model = getattr(transformers, model_class)(config).eval()
    for name, p in model.named_parameters():        # the experts' 3-D weights start empty: give them values
        if p.dim() == 3:
            torch.nn.init.normal_(p, std=0.1)
    return model


def save_causal_lm(kind: str, folder: Path) -> torch.nn.Module:
    """``causal_lm(kind)`` (or ``moe_lm(kind)``) saved with ``save_pretrained`` into ``folder``, with an
    :func:`lm_tokenizer`."""
    module = moe_lm(kind) if kind in MOE else causal_lm(kind)
    module.save_pretrained(folder)
    lm_tokenizer().save(str(Path(folder) / "tokenizer.json"))
    return module


def question_answering(seed: int = 0) -> torch.nn.Module:
    """A seeded tiny BertForQuestionAnswering (start and end logits per token) in eval mode."""
    from transformers import BertConfig, BertForQuestionAnswering
    torch.manual_seed(seed)
    return BertForQuestionAnswering(BertConfig(
        vocab_size=len(VOCAB), hidden_size=SIZE["hidden"], num_hidden_layers=SIZE["layers"],
        num_attention_heads=SIZE["heads"], intermediate_size=SIZE["ffn"], max_position_embeddings=SIZE["positions"],
        pad_token_id=0, attn_implementation="eager")).eval()


BUILDERS = {"bert": _bert, "gpt2": _gpt2, "distilbert": _distilbert, "roberta": _roberta}


def build(name: str, *, seed: int = 0, attention: str = "eager") -> torch.nn.Module:
    """A seeded tiny model of architecture ``name`` in eval mode."""
    torch.manual_seed(seed)
    return BUILDERS[name](attention).eval()


def tokenizer() -> Tokenizer:
    """Word-level tokenizer over :data:`VOCAB` with BERT-style [CLS] … [SEP]."""
    tok = Tokenizer(models.WordLevel({word: i for i, word in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tok


def lm_tokenizer() -> Tokenizer:
    """Word-level tokenizer over :data:`VOCAB` adding no special tokens (GPT-2 style), for language models."""
    tok = Tokenizer(models.WordLevel({word: i for i, word in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def token_inputs(names=("input_ids", "attention_mask", "token_type_ids"), *, batch: int = 1, length: int = 9,
                 pad_id: int = 0, pad: int = 0, seed: int = 1) -> dict[str, torch.Tensor]:
    """Random token ids (the last ``pad`` positions of item 0 padded), as torch tensors."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, len(VOCAB), (batch, length), generator=g)
    mask = torch.ones_like(ids)
    if pad:
        mask[0, length - pad:] = 0
        ids[0, length - pad:] = pad_id
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    return {n: feeds[n] for n in names}


def onnx(module: torch.nn.Module, path: Path, *, names=("input_ids", "attention_mask", "token_type_ids"),
         exporter: str = "torchscript") -> Path:
    """Export a tiny HF classifier (or causal LM) with the project's exporter; a sequence classifier's
    labels recorded as ``rulegraph export`` records them."""
    import json

    from rulegraph.exporters import HFClassifier, export_onnx
    wrapped = HFClassifier(module)
    example = token_inputs(names, batch=2, length=8, pad=2)
    metadata = {"rulegraph.max_length": "64"}
    if type(module).__name__.endswith("ForSequenceClassification"):
        config = module.config
        metadata["rulegraph.labels"] = json.dumps([str(config.id2label[i]) for i in range(config.num_labels)])
    return export_onnx(wrapped, example, path, exporter=exporter, overwrite=True, metadata=metadata)


def _bart():
    from transformers import BartConfig, BartForConditionalGeneration
    return BartForConditionalGeneration(BartConfig(
        vocab_size=len(VOCAB), d_model=SIZE["hidden"], encoder_layers=SIZE["layers"], decoder_layers=SIZE["layers"],
        encoder_attention_heads=SIZE["heads"], decoder_attention_heads=SIZE["heads"], encoder_ffn_dim=SIZE["ffn"],
        decoder_ffn_dim=SIZE["ffn"], max_position_embeddings=SIZE["positions"], pad_token_id=0, bos_token_id=2,
        eos_token_id=3, decoder_start_token_id=3, forced_eos_token_id=None, attn_implementation="eager"))


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration
    return T5ForConditionalGeneration(T5Config(
        vocab_size=len(VOCAB), d_model=SIZE["hidden"], d_kv=SIZE["hidden"] // SIZE["heads"], d_ff=SIZE["ffn"],
        num_layers=SIZE["layers"], num_decoder_layers=SIZE["layers"], num_heads=SIZE["heads"], pad_token_id=0,
        eos_token_id=3, decoder_start_token_id=0, attn_implementation="eager"))


def _marian():
    from transformers import MarianConfig, MarianMTModel
    return MarianMTModel(MarianConfig(
        vocab_size=len(VOCAB), d_model=SIZE["hidden"], encoder_layers=SIZE["layers"], decoder_layers=SIZE["layers"],
        encoder_attention_heads=SIZE["heads"], decoder_attention_heads=SIZE["heads"], encoder_ffn_dim=SIZE["ffn"],
        decoder_ffn_dim=SIZE["ffn"], max_position_embeddings=SIZE["positions"], pad_token_id=0, eos_token_id=3,
        decoder_start_token_id=0, attn_implementation="eager"))


#: encoder–decoder LMs: name → builder
SEQ2SEQ = {"bart": _bart, "t5": _t5, "marian": _marian}


def seq2seq(name: str, *, seed: int = 0) -> torch.nn.Module:
    """A seeded tiny encoder–decoder LM of architecture ``name`` in eval mode."""
    torch.manual_seed(seed)
    return SEQ2SEQ[name]().eval()


def seq2seq_inputs(source: int = 7, target: int = 4, *, batch: int = 1, seed: int = 1) -> dict[str, torch.Tensor]:
    """Random source ids (ending in the eos id 3), their mask and a target prefix."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, len(VOCAB), (batch, source), generator=g)
    ids[:, -1] = 3
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "decoder_input_ids": torch.randint(5, len(VOCAB), (batch, target), generator=g)}


def seq2seq_onnx(module: torch.nn.Module, path: Path, *, exporter: str = "torchscript") -> Path:
    """Export a tiny encoder–decoder LM with the project's exporter (the decoder's ids a graph input):
    ONNX with ``exporter`` torchscript or dynamo, or with ``torch.export`` a ``.pt2`` program beside ``path``."""
    import json

    from rulegraph.exporters import HFSeq2SeqLM, export_fx, export_onnx
    from rulegraph.exporters.hf import FX_METADATA
    example = seq2seq_inputs(8, 5, batch=2, seed=0)
    example["attention_mask"][1, 6:] = 0
    if exporter == "torch.export":
        program = export_fx(HFSeq2SeqLM(module), example)
        path = Path(path).with_suffix(".pt2")
        metadata = {"rulegraph.decoder_start_token_id": str(module.config.decoder_start_token_id)}
        torch.export.save(program, str(path), extra_files={FX_METADATA: json.dumps(metadata)})
        return path
    return export_onnx(HFSeq2SeqLM(module), example, path, exporter=exporter, overwrite=True,
                       metadata={"rulegraph.max_length": "64",
                                 "rulegraph.decoder_start_token_id": str(module.config.decoder_start_token_id)})


def next_token_gi(module: torch.nn.Module, feeds: dict[str, torch.Tensor], target: int) -> torch.Tensor:
    """The autograd reference of ``gi`` on a causal LM: x·∂z/∂x summed over the hidden size, per token of
    item 0, z the ``target`` logit at the last position, on a float64 copy of ``module`` (a mixture of
    experts runs transformers' own loop over the picked experts)."""
    import copy
    reference = copy.deepcopy(module).double()
    from rulegraph.exporters.moe import has_experts
    if has_experts(reference):
        reference.set_experts_implementation("eager")
    embeddings = reference.get_input_embeddings()(feeds["input_ids"]).detach().requires_grad_(True)
    logits = reference(inputs_embeds=embeddings, attention_mask=feeds["attention_mask"]).logits[0, -1]
    logits[target].backward()
    return (embeddings * embeddings.grad).sum(-1)[0].detach()
