r"""``captum-iglens attribute`` (the default subcommand): the IG-Lens map of the
model's answer to a prompt, printed as a table and written as JSON, CSV, PNG or
HTML."""

import argparse
import shutil
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from captum_iglens.cli.common import (
    HTML_HELP,
    CommandError,
    Job,
    Stages,
    check_lens_text,
    check_outputs,
    lens_readout,
    lens_folder,
    load,
    model_parent,
    names,
    progress,
    prompt_parent,
    read_prompt,
    save_figure,
    settings_from,
    settings_parent,
)
from captum_iglens.columns import Column, parse_columns

if TYPE_CHECKING:  # imported when the command runs, after the checks
    from captum_iglens.settings import Settings


def add_parser(commands: "argparse._SubParsersAction", name: str) -> None:
    r"""Adds the subcommand ``name`` to ``commands``."""
    attribute = commands.add_parser(
        name,
        parents=[prompt_parent(), settings_parent(), model_parent(), options_parent()],
        help="the IG-Lens map of the model's answer to a prompt (the default)",
        description="The IG-Lens map of the model's answer to a prompt.",
    )
    attribute.set_defaults(prepare=prepare)


def options_parent() -> argparse.ArgumentParser:
    r"""The main job's options beyond the model and the settings: the onset,
    the scored tokens, the readout and the output files (``shell`` takes them
    too)."""
    attribute = argparse.ArgumentParser(add_help=False)
    attribute.add_argument("--onset-frac", type=float, default=0.5)
    attribute.add_argument(
        "--foil",
        metavar="TEXT",
        help="contrastive: attribute p(answer token) - p(FOIL) at every position "
        "(TEXT must be a single token, e.g. ' Lyon')",
    )
    attribute.add_argument(
        "--target-tokens",
        metavar="TEXT,TEXT",
        type=names,
        help="attribute the total probability of these tokens (each a single "
        "token, e.g. ' Paris,Paris') in place of the answer's token",
    )
    attribute.add_argument(
        "--lens",
        metavar="logit|linear|DIR",
        help="the readout of each layer: logit (the model's own, the default), "
        "linear (this model's cached fitted lens, fitted first when there is "
        "none, as fit-lens does) or a tuned-lens folder (params.pt, config.json); "
        "credits then split into block and lens-change parts",
    )
    attribute.add_argument("--json", metavar="PATH", help="write the result as JSON")
    attribute.add_argument("--csv", metavar="PATH", help="write a long-format CSV")
    attribute.add_argument(
        "--png",
        metavar="PATH",
        help="write the heatmap as PNG (with --granularity source or source_head: "
        "the first answer token's block x source-token map)",
    )
    attribute.add_argument("--html", metavar="PATH", help=HTML_HELP)
    return attribute


def prepare(args: argparse.Namespace) -> Job:
    r"""Checks the options and loads the model; the job generates the answer,
    attributes it and writes the outputs."""
    settings, folder = check_options(args)
    prompt = read_prompt(args)
    from captum_iglens.hf.text import encode_prompt

    stages = Stages()
    parts, tokenizer = stages.run("load", lambda: load(args, settings))
    readout = lens_readout(folder, parts, tokenizer, args, settings)
    scored = scored_tokens(args, tokenizer)
    prompt_ids = encode_prompt(tokenizer, prompt, chat=settings.chat)
    if settings.positions == "prompt" and prompt_ids.shape[-1] < 2:
        raise CommandError(
            "--positions: prompt attributes each prompt token after the first, and "
            "this prompt is one token; give a longer prompt or --positions answer"
        )

    def job() -> int:
        maps = answer_and_attribute(
            parts,
            tokenizer,
            prompt,
            settings,
            readout,
            scored,
            stages,
            args,
            companion=None if folder else companion_settings(settings, args.n_steps),
        )
        if maps is None:
            return 1
        report(*maps, args)
        print(stages.summary())
        return 0

    return job


def check_options(args: argparse.Namespace) -> Tuple["Settings", Any]:
    r"""The :class:`~captum_iglens.Settings` and the ``--lens`` folder
    (:func:`~captum_iglens.cli.common.lens_folder`) of the main job's options,
    checked before the model loads; a bad option raises :class:`CommandError`."""
    from captum_iglens.attr.granularities import check_learned_readout

    from captum_iglens.hf.model_files import read_tokenizer

    if not 0.0 < args.onset_frac <= 1.0:
        raise CommandError(f"--onset-frac: expected (0, 1], got {args.onset_frac}")
    check_outputs(args, "json", "csv", "png", "html")
    check_lens_text(args.lens)
    if args.foil is not None or args.target_tokens is not None:
        files = read_tokenizer(args.model)  # the loaded one is checked too
        if files is not None:
            scored_tokens(args, files)
    settings = settings_from(args)
    folder = lens_folder(args.lens, args.path)
    if folder is not None:
        try:
            check_learned_readout(settings.granularity)
        except ValueError as err:  # the option's name as the user typed it
            raise CommandError(f"--{err}") from None
    return settings, folder


def answer_and_attribute(
    parts: Any,
    tokenizer: Any,
    prompt: str,
    settings: "Settings",
    readout: Any,
    scored: Dict[str, Any],
    stages: Stages,
    args: argparse.Namespace,
    companion: Optional["Settings"] = None,
) -> Optional[Tuple[Any, Any]]:
    r"""Generates the model's answer to ``prompt``, prints both and returns the
    answer's :class:`~captum_iglens.IGLensResult` with, for ``companion``
    settings (:func:`companion_settings`), the block map on the other path whose
    onset the table shows (else None); None, with a line saying so, when the
    answer is empty and only the answer is attributed."""
    from captum_iglens._result_tables import visible
    from captum_iglens.attr import attribute_text
    from captum_iglens.hf.text import encode_prompt, generate

    (answer_ids,) = stages.run(
        "generate",
        lambda: generate(
            parts.model,
            tokenizer,
            [encode_prompt(tokenizer, prompt, chat=settings.chat)],
            max_new_tokens=settings.max_new_tokens,
            progress=progress(args),
        ),
    )
    print(f"prompt: {visible(prompt)}")
    print(f"answer: {visible(tokenizer.decode(answer_ids))}")
    if len(answer_ids) == 0 and settings.positions == "answer":
        print("captum-iglens: the answer is empty; nothing to attribute")
        return None

    def attribute(chosen: "Settings") -> Any:
        return attribute_text(
            parts,
            tokenizer,
            prompt,
            answer=answer_ids,
            settings=chosen,
            lens=readout,
            **scored,
        )

    result = stages.run("attribute", lambda: attribute(settings))
    other = None
    if companion is not None:
        other = stages.run("other path", lambda: attribute(companion))
    return result, other


def companion_settings(
    settings: "Settings", n_steps: Optional[int] = None
) -> Optional["Settings"]:
    """The block map on the main job's other onset path, whose onset the
    table shows beside the map's own: the first path in the registry that
    declares the ``companion`` role, is not the map's own and takes these
    settings (the telescoping onset says when the final head can read the
    answer, the joint one which blocks wrote it; ``n_steps`` as given, else
    that path's default). None where no such path takes them (a baseline the
    joint block map has no column for)."""
    from captum_iglens.attr.paths import PATHS

    for name, path in PATHS.items():
        if name == settings.path or not path.companion:
            continue
        try:
            return settings.replace(
                path=name, granularity="block", top_k=0, n_steps=n_steps
            )
        except ValueError:
            continue  # the next path with the role may take them
    return None


def legend(result: Any, onset_frac: float, companion: Any = None) -> str:
    r"""The two lines under the table that say what its columns mean; with
    ``companion`` (the block map on the other path), what each path's onset
    means."""
    from captum_iglens.attr.paths import PATHS

    scored = result.foils is not None or result.target_sets is not None
    what = "score (--foil, --target-tokens)" if scored else "probability"
    onset = f"onset: first layer with {onset_frac:.0%} of |credit|"
    if companion is not None:
        paths = (result.path, companion.path)
        onset = f"onsets at {onset_frac:.0%} of |credit|: " + ", ".join(
            f"{path} = {PATHS[path].onset_meaning}" for path in paths
        )
    return (
        f"L<i>: {what} layer i adds to the token (its credit); Σ: all credits "
        "= Δp = p_model - p(start)\n"
        f"lens@top: last readout; {onset}"
    )


def report(result: Any, other: Any, args: argparse.Namespace) -> None:
    """Prints the map with its legend (and its views, and the onset of
    ``other``, the block map on the other path, or None) and writes the files
    asked for."""
    width = shutil.get_terminal_size((120, 24)).columns
    table = result.format_table(
        width=width, onset_frac=args.onset_frac, companion=other
    )
    print(table)
    print(legend(result, args.onset_frac, other))
    parts = _top_parts(result)
    if parts:
        print()
        print(parts)
    if result.has_views:
        print()
        print(result.format_views(width=width))
    if result.source_layout() is not None:
        print()
        print(result.format_sources())
    write_files(result, args)


def write_files(result: Any, args: argparse.Namespace) -> None:
    """Writes the files of ``--json``, ``--csv``, ``--html`` and ``--png``."""
    if args.json is not None:
        result.save(args.json)
    if args.csv is not None:
        result.to_csv(args.csv)
    if args.html is not None:
        result.to_html(args.html)
    if args.png is not None and result.source_layout() is not None:
        from captum_iglens.plots import plot_source_map

        drawn = plot_source_map(result, token=0)
        assert drawn is not None  # None only with show=True
        save_figure(drawn[0], args.png)
    elif args.png is not None:
        from captum_iglens.plots import plot_heatmap

        drawn = plot_heatmap(result, onset_frac=args.onset_frac)
        assert drawn is not None  # None only with show=True
        save_figure(drawn[0], args.png)


#: Heads, neurons and experts printed per answer token.
TOP_PARTS = 5


def _top_parts(result: Any, k: int = TOP_PARTS) -> str:
    """Per attributed token, its ``k`` heads, neurons or experts with the largest
    ``|credit|`` (``granularity="head"``, ``"neuron"`` or ``"expert"``), or
    ``""``."""
    from captum_iglens._result_tables import token_labels
    from captum_iglens.attr.granularities.neurons import top_neurons

    names = result.layer_names
    kinds = [column.kind for column in parse_columns(names)]
    heads = [i for i, kind in enumerate(kinds) if kind == "head"]
    experts = [i for i, kind in enumerate(kinds) if kind in ("expert", "shared")]
    has_neurons = "neuron" in kinds
    if not heads and not has_neurons and not experts:
        return ""
    labels = token_labels(result, 0)
    shown = [
        kind
        for kind, present in (
            ("heads", heads),
            ("experts", experts),
            ("neurons", has_neurons),
        )
        if present
    ]
    lines = [f"top {', '.join(shown)} (by |credit|, {k} each):"]
    for p in result.mask[0].nonzero()[:, 0].tolist():
        row = result.attributions[0, p]
        found = []
        if heads:
            order = sorted(heads, key=lambda i: -abs(float(row[i])))[:k]
            found.append(
                "heads " + ", ".join(f"{names[i]} {float(row[i]):+.4f}" for i in order)
            )
        if experts:
            order = sorted(experts, key=lambda i: -abs(float(row[i])))[:k]
            found.append(
                "experts "
                + ", ".join(f"{names[i]} {float(row[i]):+.4f}" for i in order)
            )
        if has_neurons:
            ranked = [
                (Column("neuron", block, index=neuron).name, credit)
                for block, kept in top_neurons(row, names, k).items()
                for neuron, credit in kept
                if neuron >= 0
            ]
            ranked.sort(key=lambda item: -abs(item[1]))
            found.append("neurons " + ", ".join(f"{n} {c:+.4f}" for n, c in ranked[:k]))
        lines.append(f"  {labels[p]!r}: " + "; ".join(found))
    return "\n".join(lines)


def scored_tokens(args: argparse.Namespace, tokenizer: Any) -> Dict[str, Any]:
    """``--foil`` and ``--target-tokens`` as token ids (each a single token) of
    ``tokenizer``, a Hugging Face tokenizer or the model's tokenizer file
    (:class:`~captum_iglens.hf.model_files.FileTokenizer`)."""
    from captum_iglens._utils.tokens import single_token_id

    scored: Dict[str, Any] = {}
    if args.foil is not None:
        scored["foil"] = single_token_id(tokenizer, args.foil, "--foil")
    if args.target_tokens is not None:
        if not args.target_tokens:
            raise CommandError("--target-tokens: expected at least one token")
        ids = [
            single_token_id(tokenizer, t, "--target-tokens") for t in args.target_tokens
        ]
        if len(set(ids)) != len(ids):
            raise CommandError(f"--target-tokens: the same token twice in {ids}")
        scored["target_tokens"] = set(ids)
    return scored
