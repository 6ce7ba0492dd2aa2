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
from .options import (OUTPUT, TARGETS, Grouped, image_options, input_options, method_options, model_argument,
                      pass_options, rules_option)


@click.command("explain", cls=Grouped)
@model_argument
@method_options
@input_options
@pass_options
@click.option("--json", "json_path", type=OUTPUT, help="write the explanation as JSON ('-': stdout)")
@click.option("--html", "html_path", type=OUTPUT, help="write a self-contained heatmap page")
@click.option("--force", is_flag=True, help="overwrite existing --json/--html/--png/--graph files")
@click.option("--graph", "graph_paths", type=OUTPUT, multiple=True, metavar="PATH.json|.html|.png",
              help="write the relevance graph (positions × layers, the attention's token-to-token edges; "
                   "docs/inside.md) as JSON, an HTML flow diagram or a PNG, by the suffix; repeatable")
@click.option("--targets", type=TARGETS, default=None, metavar="all|top-K|A,B,…",
              help="explain several targets from one forward, each with its own audit: every class, each item's "
                   "K highest, or a list (indices, class names, token texts); instead of --target")
@image_options
@generation_options
def explain_cmd(model, rules, method, method_option, texts, question, tokenizer, raw_inputs, json_path, html_path, force,
                steps, image_path, audio_path, png_path, image_size, image_resize, image_mean, image_std, generate_n,
                continuation, batch, span, ignore_eos, graph_paths, **opts):
    """Relevance of each input token for MODEL's output, with the conservation summary.
    Give a rule set with --rules, or any method (baselines too) with --method. For a language
    model (decoder-only or encoder–decoder), --generate N (or --continuation TEXT) explains every
    generated token in turn: a rows × generated-tokens matrix (--png draws it)."""
    from ..render.colour import explained_name
    from ..ruleset import RuleSet
    from . import render
    from .inputs import check_outputs, load_model, parse_inputs, read_files, requests_of, run_all, to_json, write
    from .options import pass_arguments, region_objective
    region_objective(opts)
    if bool(rules) == bool(method):
        raise InputError("give --rules NAME|PATH or --method NAME (see `rulegraph methods`), not both"
                         if rules else "give --rules NAME|PATH or --method NAME (see `rulegraph methods`)")
    if method_option and not method:
        raise InputError("-o/--option sets options of a --method; rule sets take none")
    if generate_n is None and continuation is None and batch is not None:
        raise InputError("--batch applies to --continuation")
    if generate_n is None and continuation is None and not steps and span:
        raise InputError("--span applies to --generate N or --continuation TEXT (their tokens, explained together); "
                         "for other sums of logits give --objective, e.g. \"logit[5]@3 + logit[9]@4\"")
    graph = load_model(model)
    options = {}
    if method:
        from ..methods import explained, get
        from .evaluate import parse_options
        m = get(method)
        options = m.resolve(parse_options(method_option, [m.name]).get(m.name, {}))
        if m.rule_set:                         # a rule set's -o score=… / contrast=…, unless --score / --contrast
            opts["contrast"], opts["score"] = explained(options, opts.get("contrast"), opts.get("score"))
    if steps:
        import warnings
        warnings.warn("--steps is deprecated: give the target prefix with --continuation TEXT (or -i "
                      "decoder_input_ids=…, as before), or --generate N", stacklevel=1)
    if generate_n is not None or continuation is not None or steps:
        if graph_paths:
            raise InputError("--graph draws one explanation: a language model's next token, without --generate / "
                             "--continuation (the API's explain(…, graph=True) takes any one of its positions)")
        from ..loaders.metadata import export_info
        from ..audio import features_input
        pictured = export_info(graph).image_tokens is not None       # a vision–language model reads --image too
        speech = features_input(graph) is not None                   # a speech-to-text model reads --audio
        if image_path is not None and not pictured or audio_path is not None and not speech or question is not None:
            raise InputError("--generate/--continuation explains a language model's text (with a vision–language "
                             "model's picture, or a speech-to-text model's clip); --image or --audio for another "
                             "model, and --question, do not apply")
        picture = clip = None
        if image_path is not None:
            from ..image import image_input
            picture = image_input(graph, image_path, size=image_size, resize=image_resize, mean=image_mean,
                                  std=image_std)
            err.print(f"[dim]{escape(picture.describe())}[/]")
        if audio_path is not None:
            from ..audio import audio_input
            clip = audio_input(graph, audio_path, model)
            err.print(f"[dim]{escape(clip.describe())}[/]")
        from .generation import explain_generation
        return explain_generation(graph, model, rules, method, options, texts, tokenizer, raw_inputs,
                                  generate_n, continuation, batch, opts, json_path, html_path, png_path, force,
                                  ignore_eos, span, picture, clip, image_path or audio_path)
    if rules:
        options = pass_arguments(RuleSet.load(rules), opts)
    if graph_paths:
        options["graph"] = _graph_option(graph_paths, rules, options)
    reads = read_files(model, tokenizer, rules, raw_inputs, image_path or audio_path)
    if image_path is not None and audio_path is not None:
        raise InputError("give --image or --audio, not both")
    if audio_path is not None:
        from ..audio import audio_input
        sound = audio_input(graph, audio_path, model)
        if texts:                       # after the model is known to take a waveform: a text model says so first
            raise InputError("give --text or --audio, not both")
        err.print(f"[dim]{escape(sound.describe())}[/]")
        requests = [{"inputs": parse_inputs(graph, raw_inputs), "audio": sound}]
    elif image_path is not None:
        from ..image import image_input
        from ..loaders.metadata import export_info
        picture = image_input(graph, image_path, size=image_size, resize=image_resize, mean=image_mean, std=image_std)
        pictured = export_info(graph).image_tokens is not None       # a vision–language model: --image and --text
        if texts and not pictured:      # after the model is known to take an image: a text model says so first
            raise InputError("give --text or --image, not both (only a vision–language model takes both)")
        pre = {"mean": picture.mean, "std": picture.std}
        err.print(f"[dim]{escape(picture.describe())}[/]")
        if pictured:
            requests = requests_of(graph, texts, raw_inputs, question)
            requests = [{**r, "inputs": {**(r.get("inputs") or {}), picture.name: picture.tensor}} for r in requests]
        else:
            requests = [{"inputs": {**parse_inputs(graph, raw_inputs), picture.name: picture.tensor}}]
    else:
        requests = requests_of(graph, texts, raw_inputs, question)
    maps = _maps_per_request(options, png_path)
    pngs = render.png_paths(png_path, len(requests) * _targets_per_request(graph, opts, png_path) * (maps or 1))
    check_outputs([(json_path, "--json"), (html_path, "--html"), *((p, "--png") for p in pngs),
                   *((p, "--graph") for p in graph_paths)], force, reads)
    if graph_paths and len(requests) > 1:
        raise InputError("--graph draws one explanation; give one --text (or write --json, which holds each one's)")
    results = run_all(graph, rules or method, requests, opts, options, tokenizer, question)
    if image_path is not None:
        results[0].normalization = (pre["mean"], pre["std"])        # as the image was preprocessed
    if pngs:
        from ..image import is_image, preprocessing
        from ..render.figure import explanation_audio_figure, explanation_figure, image_figure, save
    for i, (e, path) in enumerate(zip(results, pngs)):
        images = [k for k, v in e.boundary.items() if is_image(v)]          # NCHW, NHWC, CHW or HWC
        if images and image_path is None:       # pixels given with --input: normalised as the export says
            pre = preprocessing(graph.metadata, mean=image_mean, std=image_std)
        if images:
            figure = image_figure(e.boundary[images[0]], requests[i].get("inputs", {}).get(images[0]), mean=pre["mean"],
                                  std=pre["std"], title=f"{e.method}: {e.output}[{e.name(e.target[0])}]")
        elif "audio" in e.extra:
            figure = explanation_audio_figure(e)
        else:
            figure = explanation_figure(e)
        save(figure, path)
        err.print(f"[dim]wrote {'heatmap' if images else 'figure'} to {escape(str(path))}[/]")
    quiet = json_path is not None and str(json_path) == "-"
    for i, e in enumerate(results):
        if quiet:
            break
        if image_path is not None or render.image_key(e) is not None:     # an image: its heatmap, never its pixels
            lines = render.image_lines(e)
            if e.tokens:                # a vision–language model: the picture's line, then its text's
                lines = [*lines[:-1], *render.explanation_lines(e)]
            for line in lines:
                out.print(line)
            continue
        if "audio" in e.extra:                  # a clip: its relevance over time, never a score per sample
            for line in render.audio_lines(e):
                out.print(line)
            continue
        if len(results) > 1:
            shown = [explained_name(e)] if opts.get("targets") else []
            shown += (e.extra.get("condition") or {}).get("conditions", []) if maps != 1 else []
            out.rule(f"{i + 1}/{len(results)}" + "".join(f" · {escape(s)}" for s in shown))
        for line in render.explanation_lines(e):
            out.print(line)
        _inside(e)
    if json_path is not None:
        write(json_path, to_json(results), force, "JSON", reads)
    if html_path is not None:
        from ..render.page import explanations_page
        write(html_path, explanations_page(results, str(model)), force, "HTML", reads)
    for path in graph_paths:
        _write_graph(results[0].graph, path, str(model), force, reads)


#: the relevance graph's formats, by the suffix of ``--graph PATH``
GRAPH_SUFFIXES = (".json", ".html", ".png")


def _graph_option(paths, rules, options) -> bool:
    """``--graph`` checked: a rule set of the relevance pass, and paths of a known suffix."""
    from ..errors import choices
    if not rules or "at" not in _declared(rules):
        raise InputError("--graph reads the relevance pass's walk: give --rules with a rule set of the relevance pass "
                         "(attnlrp, lrp, gi…)")
    for p in paths:
        if str(p) == "-" or p.suffix.lower() not in GRAPH_SUFFIXES:
            raise InputError(f"--graph {p}: the suffix chooses the format; {choices(GRAPH_SUFFIXES, p.suffix)}")
    return True


def _declared(rules) -> set[str]:
    from ..options import PASS_OPTIONS
    from ..ruleset import RuleSet
    return {o.name for o in PASS_OPTIONS.get(RuleSet.load(rules).pass_name, ())}


def _write_graph(g, path, model: str, force: bool, reads) -> None:
    """The relevance graph at ``path``: JSON, a page with the SVG diagram, or a PNG (by the suffix)."""
    from ..render import flow
    from .inputs import write
    suffix = path.suffix.lower()
    if suffix == ".png":
        from ..files import check_output
        from ..render.figure import save
        check_output(path, force, "--graph", reads)
        save(flow.figure(g), path)
        err.print(f"[dim]wrote the relevance graph to {escape(str(path))}[/]")
    else:
        text = json.dumps(g.to_dict(), indent=2) if suffix == ".json" else flow.page(g, model)
        write(path, text, force, "the relevance graph", reads)


def _maps_per_request(options, png_path) -> int | None:
    """How many maps ``--condition`` makes of each target (:func:`rulegraph.inside.map_count`; ``None`` with
    ``each``, counted in the run, which ``--png`` refuses: its files are named before the run)."""
    from ..inside import map_count
    count = map_count(options.get("condition"))
    if count is None and png_path is not None:
        raise InputError("--condition …=each with --png: the units are counted in the run, so the PNG files cannot be "
                         "named before it; list them as alternatives (0|1|2)")
    return count


def _targets_per_request(graph, opts, png_path) -> int:
    """How many explanations ``--targets`` makes of each input (1 without it), refusing what does not
    go with it; ``all`` counts the classes the graph declares (where ``--png`` needs the number first)."""
    targets = opts.get("targets")
    if targets is None:
        return 1
    for flag, key in (("--target", "target"), ("--contrast", "contrast"), ("--objective or --region", "objective")):
        if opts.get(key) is not None:
            raise InputError(f"give --targets or {flag}, not both: --targets explains each of several classes")
    if isinstance(targets, list):
        return len(targets)
    if targets.startswith("top-"):
        count = targets[4:]
        if not count.isdigit() or int(count) < 1:
            raise InputError(f"--targets {targets}: K must be a whole number ≥ 1 (top-3)")
        return int(count)
    from ..loaders.metadata import labels
    classes = len(labels(graph) or ()) or (_declared_classes(graph, opts.get("output_name")) if png_path else None)
    if classes is None and png_path is not None:
        raise InputError("--targets all with --png: the graph does not declare how many classes its output has, so "
                         "the PNG files cannot be named before the run; give top-K or a list")
    return classes or 1


def _declared_classes(graph, output: str | None) -> int | None:
    """The last dim of the explained graph output, as the one probe of its kind saw it (``None``: no probe ran)."""
    from ..facts import output_kind
    kind = output_kind(graph, output if output in graph.outputs else None)
    return kind.shape[-1] if kind is not None and kind.shape else None


@click.command("audit", cls=Grouped)
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
    from .inputs import check_output, load_model, read_files, requests_of, run_all, write
    from .options import pass_arguments, region_objective
    region_objective(opts)
    reads = read_files(model, tokenizer, rules, raw_inputs)
    check_output(json_path, force, "--json", reads)
    graph = load_model(model)
    ruleset = RuleSet.load(rules)
    results = run_all(graph, ruleset, requests_of(graph, texts, raw_inputs, question), opts,
                      pass_arguments(ruleset, opts), tokenizer, question)
    flagged = False
    docs = []
    for e in results:
        a = e.audit
        flagged |= not a.ok or bool(a.unexpected)
        if json_path is not None:
            d = e.to_dict()
            d["nodes"] = [vars(n) for n in a.nodes]
            docs.append(d)
        if json_path is not None and str(json_path) == "-":
            continue
        if "text" in e.extra:
            out.rule(escape(str(e.extra["text"])[:80]))
        out.print(render.summary_table(e))
        out.print(render.reconstruction_table(a) if hasattr(a, "reconstruction") else render.layers_table(a))
        if getattr(a, "experts", None):
            out.print(render.experts_table(a))
        out.print(render.nodes_table(a, None if all_nodes else top))
        _inside(e)
    if json_path is not None:
        write(json_path, json.dumps(docs[0] if len(docs) == 1 else docs, indent=2), force, "audit", reads)
    if flagged:
        err.print("[red]conservation flagged[/]: residual or a conserving node exceeds the tolerance")
        sys.exit(1)


def _inside(e) -> None:
    """The relevance at the values ``--at`` selected (totals per head or unit, per value: per block), and what
    ``--condition`` masked out (:func:`rulegraph.inside.lines`)."""
    from ..inside import lines
    for line in lines(e):
        out.print(escape(line))


@click.command("check")
@model_argument
@rules_option
@click.option("--nodes", "show_nodes", is_flag=True, help="list every node with its rule")
@click.option("--tokenizer", type=click.Path(dir_okay=False), help="tokenizer.json for the made-up text "
              "(default: the one beside the model)")
@click.option("--output", "output_name", default=None, help="the value to explain, as explain's --output (default: the "
              "first graph output; a final Softmax's is explained as its logits)")
@click.option("--score", type=click.Choice(["logit", "logprob", "probability"]), default="logit", show_default=True,
              help="as explain's --score (probability: a final Softmax's output itself)")
def check_cmd(model, rules, show_nodes, tokenizer, output_name, score):
    """Which rule each node got, and from which rule-file line; then explain runs on made-up inputs of
    the model's declared shapes at two lengths. Lists every gap at once — ops with no implementation,
    rules that cannot apply, nodes without a rule, what fails when it runs — and exits 1 on any that
    would stop `explain`."""
    from ..dryrun import dry_run
    from ..ops import unsupported
    from .inputs import load_model
    run = dry_run(load_model(model), rules, tokenizer=tokenizer, output=output_name, score=score)
    graph, binding = run.graph, run.binding
    if run.refusal is not None:         # explain's own one-line refusal, word for word
        out.print(f"[red]explain refuses[/]: {escape(run.refusal)}")
    if binding is None:
        out.print(f"[red]no relevance boundary[/]: {escape(str(run.gaps[0]))}")
        sys.exit(1)
    ruleset = binding.ruleset
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
    missing = unsupported(graph.nodes)
    if missing:
        out.print(f"[red]{sum(map(len, missing.values()))} node(s) of {len(missing)} op type(s) have no "
                  "implementation[/] (the forward cannot run):")
        for (domain, op), names in missing.items():
            where = f" (domain {domain})" if domain not in ("", "ai.onnx") else ""
            out.print(f"  {escape(op)}{escape(where)}: {len(names)} node(s), first {escape(names[0])}")
    rule_problems = [g for g in run.gaps if g.kind == "rule"]
    if rule_problems:
        out.print(f"[red]{len(rule_problems)} rule(s) cannot apply to the node they matched[/]:")
        for g in rule_problems[:50]:
            out.print(f"  {escape(str(g))}")
    if binding.unmatched:
        out.print(f"[red]{len(binding.unmatched)} node(s) without a rule[/] (on_unmatched: {ruleset.on_unmatched}):")
        for n in binding.unmatched[:50]:
            out.print(f"  {escape(n.name)}  [dim]({escape(n.op)})[/]")
    ran = [g for g in run.gaps if g.kind in ("run", "explain")]
    if ran:
        out.print(f"[red]{len(ran)} failure(s) running explain on made-up inputs[/] "
                  f"({escape('; '.join(run.shapes))}):")
        for g in ran:
            out.print(f"  {escape(str(g))}")
    if run.ok and not binding.unmatched:
        out.print("[green]every op runs, every node relevance reaches has a rule that applies, and explain runs on "
                  f"made-up inputs ({escape('; '.join(run.shapes))})[/]")
    if not missing:
        _heads_table(graph)
    if not run.ok:
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
                    "(head count from one forward on a small made-up input)")
    for col in ("block", "heads", "softmax node", "value-product node"):
        t.add_column(col, justify="right" if col in ("block", "heads") else "left", overflow="fold")
    for b in blocks:
        t.add_row(str(b.block), str(b.heads), escape(b.softmax), escape(b.product))
    out.print(t)
