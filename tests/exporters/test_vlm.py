"""Vision–language models (tiny random Gemma 3 and InternVL: image patches and text tokens in one sequence):
`rulegraph export` writes them with the number of image tokens a picture takes; the forward equals onnxruntime's
and the module's; `gi` equals autograd Gradient×Input at the token lookups and at the pixels; every shipped
transformer rule set conserves over both in float64, and `check` runs on made-up inputs holding the picture's
tokens; `explain` takes a text with a picture (the API and the command line), puts the image tokens after the
leading special tokens and shows both; a generation with a picture has it as one row of its matrix."""
from __future__ import annotations

import copy
import numpy as np
import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

import rulegraph
import shell
import tiny
from rulegraph.dryrun import dry_run
from rulegraph.errors import InputError
from rulegraph.exporters import load_hf
from rulegraph.loaders.metadata import export_info
from rulegraph.render.colour import input_units
from rulegraph.text import IMAGE_TOKEN

transformers = pytest.importorskip("transformers")
F64 = torch.float64
#: the tiny vocabulary and the image token after it
IMAGE = len(tiny.VOCAB)
TEXT = dict(vocab_size=IMAGE + 1, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=128, pad_token_id=0, bos_token_id=None, eos_token_id=None)
VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2)


def vision_lm(kind: str) -> torch.nn.Module:
    """A seeded tiny vision–language model over 16 × 16 pictures in 4 × 4 patches, in eval mode."""
    torch.manual_seed(0)
    if kind == "gemma3":
        text = transformers.Gemma3TextConfig(**TEXT, num_key_value_heads=1, head_dim=8)
        vision = transformers.SiglipVisionConfig(**VISION, image_size=16, patch_size=4)
        model = transformers.Gemma3ForConditionalGeneration(transformers.Gemma3Config(
            vision_config=vision.to_dict(), text_config=text.to_dict(), image_token_index=IMAGE,
            mm_tokens_per_image=4))
        # the projection from the picture into the text starts at zero (no picture reaches the text): give it values
        torch.nn.init.normal_(model.model.multi_modal_projector.mm_input_projection_weight, std=0.3)
    elif kind == "internvl":
        vision = transformers.InternVLVisionConfig(**VISION, image_size=[16, 16], patch_size=[4, 4])
        model = transformers.InternVLForConditionalGeneration(transformers.InternVLConfig(
            vision_config=vision, text_config=transformers.Qwen2Config(**TEXT, num_key_value_heads=2),
            image_token_id=IMAGE, downsample_ratio=0.5))
    else:
        raise ValueError(f"no tiny vision–language model {kind!r}")
    return model.eval()


def tokenizer() -> Tokenizer:
    """The tiny word-level tokenizer with the image token after its vocabulary."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate([*tiny.VOCAB, IMAGE_TOKEN])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def save(kind: str, folder) -> torch.nn.Module:
    module = vision_lm(kind)
    module.save_pretrained(folder)
    tokenizer().save(str(folder / "tokenizer.json"))
    return module


@pytest.fixture(scope="module", params=["gemma3", "internvl"])
def exported(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    module = save(request.param, folder / "hf")
    path = rulegraph.exporters.export_hf(folder / "hf", folder / "out")
    info = export_info(rulegraph.load(str(path)))
    ids = torch.tensor([[IMAGE] * info.image_tokens + [7, 8, 9, 10, 11]])
    pixels = torch.randn(1, *info.image_size, generator=torch.Generator().manual_seed(1))
    return module, folder, path, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels}


def test_the_export_records_the_picture_and_its_tokens(exported):
    module, folder, path, _ = exported
    info = export_info(rulegraph.load(str(path)))
    assert info.task == "image-text-to-text" and info.image_token_id == IMAGE
    assert info.image_tokens == {"gemma3": 4, "internvl": 4}[module.config.model_type]
    assert info.image_size == (3, 16, 16)
    assert "rulegraph.export_check" in rulegraph.load(str(path)).metadata     # checked at two other sizes


def test_forward_equals_onnxruntime_and_the_module(exported):
    module, folder, path, inputs = exported
    expected = ort.InferenceSession(str(path)).run(None, {k: v.numpy() for k, v in inputs.items()})[0]
    got = rulegraph.run(rulegraph.load(str(path)), inputs)["logits"].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        reference = module(**inputs, use_cache=False).logits.numpy()
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-5)


def test_gi_equals_autograd_at_the_tokens_and_the_pixels(exported):
    _, folder, path, inputs = exported
    e = rulegraph.explain(str(path), "gi", inputs, dtype=F64)
    wrapper, _ = load_hf(folder / "hf")
    wrapper = copy.deepcopy(wrapper).double()
    caught = []

    def hook(module, args, out):
        out.retain_grad()
        caught.append(out)
    handle = wrapper.model.get_input_embeddings().register_forward_hook(hook)
    pixels = inputs["pixel_values"].double().requires_grad_(True)
    wrapper(inputs["input_ids"], inputs["attention_mask"], pixels)[0, -1, e.target[0]].backward()
    handle.remove()
    tokens = (caught[0] * caught[0].grad).sum(-1).detach()
    by_pixel = (pixels * pixels.grad).sum(1).detach()
    assert float(by_pixel.abs().max()) > 1e-6              # the picture reaches the explained logit
    for got, reference in ((e.relevance["input_ids"], tokens), (e.relevance["pixel_values"], by_pixel)):
        # Hugging Face's RMSNorms compute in float32 even in a float64 module: 1e-5 of the largest score
        torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5 * float(reference.abs().max()))
    assert torch.all(e.relevance["input_ids"][0, :4] == 0)   # the image tokens' lookups are overwritten


@pytest.mark.parametrize("rules", sorted(rulegraph.shipped_rule_sets()))
def test_every_rule_set_conserves_over_tokens_and_pixels(exported, rules):
    _, _, path, _ = exported
    run = dry_run(str(path), rules, lengths=(6,), dtype=F64)  # made-up ids hold the picture's image tokens
    assert run.ok, [str(g) for g in run.gaps]
    for e in run.explanations.values():
        assert set(e.relevance) == {"input_ids", "pixel_values"}
        assert e.audit.conservation.relative_error <= 1e-10 and not e.audit.unexpected


def test_a_text_and_a_picture_through_the_api(exported):
    _, folder, path, _ = exported
    picture = np.random.default_rng(0).random((20, 24, 3))
    e = rulegraph.explain(str(path), "attnlrp", text="w1 w2 w3", image=picture)
    count = export_info(rulegraph.load(str(path))).image_tokens
    assert e.tokens[0] == [IMAGE_TOKEN] * count + ["w1", "w2", "w3"]
    assert e.special[0] == [True] * count + [False] * 3
    assert e.texts[0][count] == " w1"
    assert e.pixels["pixel_values"].shape == (1, 3, 16, 16)
    assert input_units(e) == "tokens and pixels"
    with pytest.raises(InputError, match="reads a picture with its text: give image="):
        rulegraph.explain(str(path), "attnlrp", text="w1 w2 w3")
    with pytest.raises(InputError, match="explains one text with its picture; got 2 texts"):
        rulegraph.explain(str(path), "attnlrp", text=["w1 w2", "w3"], image=picture)


@pytest.mark.parametrize("exported", ["internvl"], indirect=True)      # the command line is the API's
def test_a_text_and_a_picture_on_the_command_line(exported, tmp_path):
    _, _, path, _ = exported
    from PIL import Image
    Image.fromarray((np.random.default_rng(0).random((20, 24, 3)) * 255).astype("uint8")).save(tmp_path / "pic.png")
    ran = shell.rulegraph(["explain", path, "--image", "pic.png", "--text", "w1 w2 w3", "-r", "attnlrp"], tmp_path)
    ran.ok()
    assert "pixel_values: image relevance" in ran.out and "w1" in ran.out
    assert "the tokens and pixels carry" in " ".join(ran.out.split())


def test_a_text_model_still_refuses_a_picture_with_its_text(tmp_path):
    tiny.save_causal_lm("llama", tmp_path / "hf")
    path = rulegraph.exporters.export_hf(tmp_path / "hf", tmp_path / "out")
    with pytest.raises(InputError, match="only a vision–language model takes both"):
        rulegraph.explain(str(path), "attnlrp", text="w1 w2", image=np.zeros((16, 16, 3)))
    with pytest.raises(InputError, match="image= is a vision–language model's picture"):
        rulegraph.generate(str(path), "attnlrp", text="w1 w2", image=np.zeros((16, 16, 3)), max_new_tokens=1)


def test_a_vision_language_model_in_memory_is_refused_with_the_way_out():
    """torch.export leaves the model's checks on its image tokens (aten._is_all_true, item), which the fx loader
    does not lower: the refusal says to export the model."""
    with pytest.raises(rulegraph.errors.UnsupportedOpError, match="export the model to ONNX with `rulegraph export`"):
        rulegraph.explain(vision_lm("internvl"), "gi", text="w1 w2", image=np.zeros((16, 16, 3)), tokenizer=tokenizer())


def test_a_generation_with_a_picture_is_one_row_per_token_and_one_for_the_picture(exported):
    """Each greedy step is what explain gives on its prefix and picture; the picture's image tokens are one row
    (group picture), the relevance of its pixels; a continuation's steps, explained from one forward, equal them."""
    _, _, path, _ = exported
    picture = np.random.default_rng(1).random((16, 16, 3))
    g = rulegraph.generate(str(path), "attnlrp", text="w1 w2 w3", image=picture, max_new_tokens=2, dtype=F64)
    assert g.rows[:4] == [IMAGE_TOKEN, " w1", " w2", " w3"] and g.groups[:4] == ["picture", "prompt", "prompt", "prompt"]
    e = rulegraph.explain(str(path), "attnlrp", text="w1 w2 w3", image=picture, dtype=F64)
    count = export_info(rulegraph.load(str(path))).image_tokens
    expected = [float(e.relevance["pixel_values"].sum()), *e.relevance["input_ids"][0, count:].tolist()]
    np.testing.assert_allclose(g.steps[0].scores, expected, rtol=1e-12, atol=1e-15)
    assert g.steps[0].token == e.target[0]
    c = rulegraph.generate(str(path), "attnlrp", text="w1 w2 w3", image=picture, dtype=F64,
                           continuation=[s.token for s in g.steps])
    for greedy, given in zip(g.steps, c.steps):
        np.testing.assert_allclose(given.scores, greedy.scores, rtol=1e-10, atol=1e-13)
    with pytest.raises(InputError, match="reads a picture with its prompt: give image="):
        rulegraph.generate(str(path), "attnlrp", text="w1 w2", max_new_tokens=1)


@pytest.mark.parametrize("exported", ["internvl"], indirect=True)      # the command line is the API's
def test_a_generation_with_a_picture_on_the_command_line(exported, tmp_path):
    _, _, path, _ = exported
    from PIL import Image
    Image.fromarray((np.random.default_rng(0).random((16, 16, 3)) * 255).astype("uint8")).save(tmp_path / "pic.png")
    ran = shell.rulegraph(["explain", path, "--image", "pic.png", "--text", "w1 w2", "-r", "attnlrp", "--generate",
                           "2", "--html", "g.html"], tmp_path)
    ran.ok()
    assert "picture share" in ran.out and IMAGE_TOKEN in ran.out and (tmp_path / "g.html").is_file()
