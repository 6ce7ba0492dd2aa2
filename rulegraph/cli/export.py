"""``rulegraph export``: a Hugging Face model directory → model.onnx (or model.pt2) + tokenizer.json (text)
or preprocessor_config.json (images)."""
from __future__ import annotations

from pathlib import Path

import click

from ..errors import InputError
from .console import err, out


@click.command("export")
@click.argument("source", type=click.Path(path_type=Path))
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["onnx", "fx"]), default="onnx", show_default=True,
              help="onnx: OUT_DIR/model.onnx; fx: a torch.export program saved as OUT_DIR/model.pt2")
@click.option("--exporter", type=click.Choice(["torchscript", "dynamo"]), default="torchscript", show_default=True,
              help="ONNX exporter")
@click.option("--opset", type=int, default=18, show_default=True)
@click.option("--attention", type=click.Choice(["eager", "sdpa"]), default="eager", show_default=True,
              help="attention implementation to export (eager gives an explicit Softmax → MatMul)")
@click.option("--task", default=None, metavar="NAME",
              help="the head to export: sequence-classification, image-classification, audio-classification "
                   "(input input_values, the waveform), causal-lm, question-answering (outputs start_logits, "
                   "end_logits), image-text-to-text (a vision–language model: inputs input_ids, attention_mask, "
                   "pixel_values), speech-seq2seq (Whisper: inputs input_features, decoder_input_ids) or seq2seq-lm "
                   "(inputs input_ids, attention_mask, decoder_input_ids); "
                   "default: the one config.json's architectures names")
@click.option("--external-data-above", "external_mib", type=click.FloatRange(min=0), default=1024, show_default=True,
              metavar="MIB", help="ONNX: above this many MiB of weights (0: always; over 2 GiB: always) write them to "
                                  "model.onnx.data beside model.onnx")
@click.option("--force", is_flag=True, help="overwrite an existing export")
def export_cmd(source, out_dir, fmt, exporter, opset, attention, task, external_mib, force):
    """Export a Hugging Face model directory SOURCE (text, image or audio) to OUT_DIR/model.onnx or model.pt2,
    with its tokenizer.json or preprocessor_config.json."""
    from ..exporters import HEADS, export_hf, save_hf_fx
    from ..exporters.to_onnx import check_exporter_options
    if task is not None:
        HEADS.get(task)                 # an unknown task: one line naming the valid ones
    try:
        check_exporter_options(exporter, opset)
    except ValueError as exc:
        raise InputError(f"--opset/--exporter: {exc}") from None
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"OUT_DIR {out_dir} is a file; give a folder")
    made = not out_dir.exists()
    with err.status(f"exporting {source} ({fmt}{', ' + exporter + ' exporter' if fmt == 'onnx' else ''})…"):
        try:
            if fmt == "fx":
                path = save_hf_fx(source, out_dir, attention=attention, overwrite=force, task=task)
            else:
                path = export_hf(source, out_dir, exporter=exporter, attention=attention, opset=opset, overwrite=force,
                                 task=task, external_data=int(external_mib * 2**20))
        except FileExistsError as exc:
            raise InputError(f"{exc.filename or str(exc).split(' already')[0]} already exists; pass --force to "
                             "overwrite it") from None
        except (ValueError, FileNotFoundError) as exc:
            raise InputError(str(exc)) from None
        finally:
            if made and out_dir.is_dir() and not any(out_dir.iterdir()):
                out_dir.rmdir()           # leave no empty folder behind a failed export
    data = path.with_name(path.name + ".data")
    extra = f" + {data.name} ({data.stat().st_size / 2**20:.1f} MiB)" if fmt == "onnx" and data.exists() else ""
    out.print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB){extra}")
    check = _check_line(path, fmt)
    if check:
        out.print(f"checked: {check}")


def _check_line(path: Path, fmt: str) -> str | None:
    """The export check's result as the export recorded it (ONNX metadata, or the .pt2's metadata file)."""
    if fmt == "onnx":
        from ..exporters import read_metadata
        return read_metadata(path).get("rulegraph.export_check")
    import json
    import zipfile
    with zipfile.ZipFile(path) as archive:
        name = next((n for n in archive.namelist() if n.endswith("rulegraph.json")), None)
        return json.loads(archive.read(name)).get("rulegraph.export_check") if name else None
