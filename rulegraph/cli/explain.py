"""``rulegraph explain | audit | check``: one model, one rule set (or method), some inputs."""
from __future__ import annotations

import json
import sys
from collections import Counter

import click
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..errors import InputError
from .console import err, out
from .generation import generation_options
from .options import OUTPUT, image_options, input_options, method_options, model_argument, pass_options, rules_option


@click.command("explain")
@model_argument
@method_options
@input_options
@pass_options
@click.option("--json", "json_path", type=OUTPUT, help="write the explanation as JSON ('-': stdout)")
@click.option("--html", "html_path", type=OUTPUT, help="write a self-contained heatmap page")
@click.option("--force", is_flag=True, help="overwrite existing --json/--html/--png files")
@image_options
@generation_options
def explain_cmd(model, rules, method, method_option, texts, question, tokenizer, raw_inputs, json_path, html_path, force,
                steps, image_path, png_path, image_size, image_resize, image_mean, image_std, generate_n, continuation,
                batch, **opts):
    """Relevance of each input token for MODEL's output, with the conservation summary.
    Give a rule set with --rules, or any method (baselines too) with --method. For a language
    model (decoder-only or encoder–decoder), --generate N (or --continuation TEXT) explains every
    generated token in turn: a rows × generated-tokens matrix (--png draws it)."""
    from ..ruleset import RuleSet
    from ..text import TextEncoder
    from . import render
    from .inputs import (check_output, load_model, parse_inputs, read_files, requests_of, resolve_targets, run_all,
                         to_json, write)
    if bool(rules) == bool(method):
        raise InputError("give --rules NAME|PATH or --method NAME (see `rulegraph methods`), not both"
                         if rules else "give --rules NAME|PATH or --method NAME (see `rulegraph methods`)")
    if method_option and not method:
        raise InputError("-o/--option sets options of a --method; rule sets take none")
    if generate_n is None and continuation is None and batch != 1:
        raise InputError("--batch applies to --continuation")
    graph = load_model(model)
    options = {}
    if method:
        from ..methods import get
        from .evaluate import parse_options
        m = get(method)
        options = m.resolve(parse_options(method_option, [m.name]).get(m.name, {}))
    if steps:
        import warnings
        warnings.warn("--steps is deprecated: give the target prefix with --continuation TEXT (or -i "
                      "decoder_input_ids=…, as before), or --generate N", stacklevel=1)
    if generate_n is not None or continuation is not None or steps:
        if image_path is not None or question is not None:
            raise InputError("--generate/--continuation explains a language model's text; --image and --question "
                             "do not apply")
        from .generation import explain_generation
        return explain_generation(graph, model, rules, method, options, texts, tokenizer, raw_inputs,
                                  generate_n, continuation, batch, opts, json_path, html_path, png_path, force)
    opts = resolve_targets(graph, model, tokenizer, opts)
    chosen = None
    if method:
        from ..methods import Vocab
        vocab = None
        if texts or tokenizer:
            vocab = Vocab.from_tokenizer(TextEncoder.for_model(graph, model, tokenizer).tokenizer)
        chosen = (m, options, vocab)
        ruleset = None
    else:
        ruleset = RuleSet.load(rules)
    if png_path is None and image_path is not None and html_path is not None and str(html_path) != "-":
        png_path = html_path.with_suffix(".png")      # the heatmap beside the page
    reads = read_files(model, tokenizer, rules, raw_inputs, image_path)
    for path, option in ((json_path, "--json"), (html_path, "--html"), (png_path, "--png")):
        check_output(path, force, option, reads)
    if image_path is not None:
        from ..image import load_image, preprocessing
        pixels = next((i.name for i in graph.inputs if i.is_float), None)
        if pixels is None or texts:
            raise InputError("--image needs a model with a float (pixel) input, and no --text")
        pre = preprocessing(graph.metadata, size=image_size, resize=image_resize, mean=image_mean, std=image_std)
        requests = [({**parse_inputs(graph, raw_inputs), pixels: load_image(image_path, **pre)}, None)]
    else:
        requests = requests_of(graph, model, texts, tokenizer, raw_inputs, question)
    if png_path is not None and image_path is None:
        raise InputError("--png writes an image heatmap (give --image PATH) or a generation's matrix "
                         "(give --generate N or --continuation TEXT)")
    results = run_all(graph, ruleset, requests, opts, chosen)
    if png_path is not None:
        from ..image import write_heatmap
        e = results[0][0]
        write_heatmap(e.boundary[pixels], png_path, image=requests[0][0][pixels], mean=pre["mean"], std=pre["std"],
                      title=f"{e.rules}: {e.output}[{e.target[0]}]")
        err.print(f"[dim]wrote heatmap to {escape(str(png_path))}[/]")
    quiet = json_path is not None and str(json_path) == "-"
    for i, (e, enc) in enumerate(results):
        if quiet:
            break
        if image_path is not None:
            out.print(render.summary_table(e))
            continue
        if len(results) > 1:
            out.rule(f"{i + 1}/{len(results)}")
        key = next(iter(e.relevance))
        tokens = enc.tokens if enc else [str(k) for k in range(len(e.scores(key)))]
        out.print(render.heatmap_text(tokens, e.scores(key), enc.special if enc else None))
        out.print(render.top_tokens(tokens, e.scores(key), enc.special if enc else None))
        note = render.mass_note(tokens, e.scores(key), enc.special if enc else None)
        if note:
            out.print(Text(note, style="yellow"))
        out.print(render.summary_table(e))
    if json_path is not None:
        write(json_path, to_json(results), force, "JSON", reads)
    if html_path is not None:
        page = render.html_report([(e, enc.tokens if enc else None, enc.special if enc else None,
                                    enc.text if enc else None) for e, enc in results], str(model))
        write(html_path, page, force, "HTML", reads)


@click.command("audit")
@model_argument
@rules_option
@input_options
@pass_options
@click.option("--json", "json_path", type=OUTPUT, help="write the audit as JSON ('-': stdout)")
@click.option("--top", type=click.IntRange(min=0), default=25, show_default=True,
              help="nodes to list (largest absorbed/breaks/errors)")
@click.option("--all", "all_nodes", is_flag=True, help="list every node")
@click.option("--force", is_flag=True, help="overwrite an existing --json file")
def audit_cmd(model, rules, texts, question, tokenizer, raw_inputs, json_path, top, all_nodes, force, **opts):
    """Per-layer and per-node conservation table. Exits 1 if conservation is flagged."""
    from ..ruleset import RuleSet
    from . import render
    from .inputs import check_output, load_model, read_files, requests_of, resolve_targets, run_all, write
    reads = read_files(model, tokenizer, rules, raw_inputs)
    check_output(json_path, force, "--json", reads)
    graph = load_model(model)
    opts = resolve_targets(graph, model, tokenizer, opts)
    ruleset = RuleSet.load(rules)
    results = run_all(graph, ruleset, requests_of(graph, model, texts, tokenizer, raw_inputs, question), opts)
    flagged = False
    docs = []
    for e, enc in results:
        a = e.audit
        flagged |= not a.ok or bool(a.unexpected)
        if json_path is not None:
            d = e.to_dict()
            d["nodes"] = [vars(n) for n in a.nodes]
            docs.append(d)
        if json_path is not None and str(json_path) == "-":
            continue
        if enc is not None:
            out.rule(escape(enc.text[:80]))
        out.print(render.summary_table(e))
        out.print(render.reconstruction_table(a) if hasattr(a, "reconstruction") else render.layers_table(a))
        out.print(render.nodes_table(a, None if all_nodes else top))
    if json_path is not None:
        write(json_path, json.dumps(docs[0] if len(docs) == 1 else docs, indent=2), force, "audit", reads)
    if flagged:
        err.print("[red]conservation flagged[/]: residual or a conserving node exceeds the tolerance")
        sys.exit(1)


@click.command("check")
@model_argument
@rules_option
@click.option("--nodes", "show_nodes", is_flag=True, help="list every node with its rule")
def check_cmd(model, rules, show_nodes):
    """Which rule each node got, and from which rule-file line. Lists every gap at once — ops with
    no implementation, rules that cannot apply, nodes without a rule — and exits 1 on any that
    would stop `explain`."""
    from ..api import prepared
    from ..ops import unsupported
    from .inputs import load_model
    graph, ruleset = prepared(load_model(model), rules)
    binding = ruleset.bind(graph)
    if show_nodes:
        t = Table(title=f"rule per node ({len(binding.reached)} reached by relevance)")
        for col in ("node", "op", "layer", "rule", "from"):
            t.add_column(col, overflow="fold")
        for n in binding.reached:
            a = binding.assignments.get(n.name)
            t.add_row(escape(n.name), escape(n.op), escape(graph.layers[n.name]),
                      escape(a.rule.describe()) if a else "[red]no rule[/]", escape(a.where) if a else "")
        out.print(t)
    else:
        counts = Counter((n.op, binding.assignments[n.name].rule.describe(), binding.assignments[n.name].where)
                         for n in binding.reached if n.name in binding.assignments)
        t = Table(title=escape(f"{graph.name or model}: {len(binding.reached)} of {len(graph.nodes)} nodes reached "
                               f"by relevance, boundary: {', '.join(sorted(set(binding.boundary.values())))}"))
        for col in ("op", "rule", "from", "nodes"):
            t.add_column(col, justify="right" if col == "nodes" else "left")
        for (op, rule, where), k in sorted(counts.items(), key=lambda kv: kv[0][2]):
            t.add_row(escape(op), escape(rule), escape(where), str(k))
        out.print(t)
    failed = False
    missing = unsupported(graph.nodes)
    if missing:
        failed = True
        out.print(f"[red]{sum(map(len, missing.values()))} node(s) of {len(missing)} op type(s) have no "
                  "implementation[/] (the forward cannot run):")
        for (domain, op), names in missing.items():
            where = f" (domain {domain})" if domain not in ("", "ai.onnx") else ""
            out.print(f"  {escape(op)}{escape(where)}: {len(names)} node(s), first {escape(names[0])}")
    rule_problems = [p for p in binding.problems if p.__class__.__name__ != "UnsupportedOpError"]
    if rule_problems:
        failed = True
        out.print(f"[red]{len(rule_problems)} rule(s) cannot apply to the node they matched[/]:")
        for p in rule_problems[:50]:
            out.print(f"  {escape(str(p))}")
    if binding.unmatched:
        out.print(f"[red]{len(binding.unmatched)} node(s) without a rule[/] (on_unmatched: {ruleset.on_unmatched}):")
        for n in binding.unmatched[:50]:
            out.print(f"  {escape(n.name)}  [dim]({escape(n.op)})[/]")
        failed |= ruleset.on_unmatched == "error"
    if not missing:
        from .inputs import dummy_forward
        failed |= dummy_forward(graph)
    if not failed and not binding.unmatched:
        out.print("[green]every op runs, and every node relevance reaches has a rule that applies[/]")
    if not missing:
        _heads_table(graph)
    if failed:
        sys.exit(1)


def _heads_table(graph) -> None:
    """The attention blocks and their heads (rulegraph.heads), after check's own output; nothing
    for a graph without attention."""
    from ..errors import RulegraphError
    from ..heads import attention_nodes, find_heads
    if not attention_nodes(graph):
        return
    try:
        blocks = find_heads(graph)
    except RulegraphError as exc:
        out.print(f"[yellow]attention heads not counted[/]: {escape(str(exc))}")
        return
    t = Table(title=f"attention: {len(blocks)} blocks, {sum(b.heads for b in blocks)} heads "
                    "(head count from one forward on a 1×5 dummy input)")
    for col in ("block", "heads", "softmax node", "value-product node"):
        t.add_column(col, justify="right" if col in ("block", "heads") else "left", overflow="fold")
    for b in blocks:
        t.add_row(str(b.block), str(b.heads), escape(b.softmax), escape(b.product))
    out.print(t)
