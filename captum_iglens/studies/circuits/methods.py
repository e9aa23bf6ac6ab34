r"""
The methods of the circuit harness, without torch: the one registry of edge
scorers (:data:`SCORERS`, read-only; :func:`register` adds one), a method's
text on the command line (:func:`parse_method`) and its record in a resumable
folder (:func:`method_stem`, :func:`check_record`).

An ensemble, ``mean:A+B[+C…]``, is a scorer whose argument is other methods
(``Scorer.averages``), and a search, ``search:METHOD``, one whose argument is
one method scored on the training pairs (``Scorer.searches``):
:func:`parse_method` parses and checks their parts.

The shipped records name their functions in
:mod:`~captum_iglens.studies.circuits.scorers` (and the modules it uses), which
are imported on a function's first call, so that the command's help and its
refusals of bad methods or records answer before torch loads.
"""

import hashlib
import importlib
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Hashable,
    List,
    Mapping,
    Optional,
    Tuple,
)

from captum_iglens._utils.schema import (
    Default,
    Integer,
    ListOf,
    MapOf,
    Number,
    Record,
    Text,
)
from captum_iglens._utils.serialization import parse_json
from captum_iglens.attr.flow.options import DEFAULT_STEPS, check_steps

if TYPE_CHECKING:
    import torch

    from captum_iglens.graph.model_graph import ModelGraph
    from captum_iglens.studies.circuits.context import Scores, ScoringContext

#: How a ground truth is compared with a method: ``(graph, scores, truth) ->
#: (a, b)``, the two vectors whose Spearman correlation is reported.
Comparison = Callable[
    ["ModelGraph", "torch.Tensor", "torch.Tensor"],
    Tuple["torch.Tensor", "torch.Tensor"],
]


#: One method's curve as saved, in its record and in a result (``K`` sizes).
CURVE = Record(
    method=Text(nonempty=True),
    n_edges=ListOf(Integer(low=0), "K"),
    f=ListOf(Number(), "K"),
    f_abs=ListOf(Number(), "K"),
    cpr=Number(),
    cmd=Number(low=0),
    cpr_ci=ListOf(Number(), "I"),
    cmd_ci=ListOf(Number(), "I"),
    seconds=Default(MapOf(Number(low=0))),
)


class _Later:
    r"""The function ``name`` of the module ``module`` of this package, imported
    on its first call, with ``keywords`` bound as by ``functools.partial``."""

    def __init__(self, module: str, name: str, **keywords: Any) -> None:
        self.module, self.name, self.keywords = module, name, keywords

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = importlib.import_module(f"{__package__}.{self.module}")
        return getattr(module, self.name)(*args, **self.keywords, **kwargs)

    def __repr__(self) -> str:
        bound = "".join(f", {k}={v!r}" for k, v in self.keywords.items())
        return f"{self.module}.{self.name}({bound[2:]})"


@dataclass(frozen=True)
class Scorer:
    r"""
    One edge scorer of the harness.

    Args:
        function (callable): ``(context: ScoringContext) -> scores``.
        summary (str): What it is, in a few words (the command's help).
        steps (int, optional): Its default step count where it takes one
                    (``NAME:STEPS``). Default: None (it takes none)
        truth (callable, optional): Where it is a ground truth of the rank
                    correlations rather than a method scored as circuits,
                    how it is compared (:data:`Comparison`). Default: None
        reads_file (bool, optional): Its argument is a file it reads
                    (``NAME:PATH``, in ``context.path``); before the model's
                    first forward it is called once on a context without
                    pairs, where it reads the file and checks it against the
                    model (a ``ValueError`` refuses the file). Default: False
        averages (bool, optional): Its argument is two or more methods
                    joined by ``+`` (``NAME:A+B``), each scored first (or
                    reused where the run has scored it) and given in
                    ``context.parts``. Default: False
        searches (bool, optional): Its argument is one method
                    (``NAME:METHOD``), scored on the training pairs and given
                    in ``context.parts``; the scorer itself runs on the
                    training pairs (``context.batches``), never on the scored
                    ones, and returns ``(2, S, R)`` scores: the ranking of
                    CPR's circuits, then CMD's. A run without training pairs
                    refuses it. Default: False
        check_steps (callable, optional): ``(steps, name) -> None``, raising
                    a ``ValueError`` that names ``name`` for a step count it
                    cannot take, called as the method is parsed (the flow's
                    :func:`~captum_iglens.attr.flow.options.check_steps`).
                    Default: None (any positive count)

    Raises:
        ValueError: If ``steps`` is not a positive int, or is given with
            ``reads_file``, ``averages`` or ``searches``, or two of those
            are set.
        TypeError: If ``function``, ``truth`` or ``check_steps`` is not
            callable.
    """

    function: Callable[["ScoringContext"], "Scores"]
    summary: str
    steps: Optional[int] = None
    truth: Optional[Comparison] = None
    reads_file: bool = False
    averages: bool = False
    check_steps: Optional[Callable[[int, str], None]] = None
    searches: bool = False

    def __post_init__(self) -> None:
        for name in ("function", "truth", "check_steps"):
            value = getattr(self, name)
            if not callable(value) and not (name != "function" and value is None):
                raise TypeError(f"{name}: expected a callable, got {value!r}")
        steps = self.steps
        if steps is not None and (
            isinstance(steps, bool) or not isinstance(steps, int) or steps < 1
        ):
            raise ValueError(f"steps: expected a positive int or None, got {steps!r}")
        if steps is not None and self.reads_file:
            raise ValueError("steps: a scorer that reads a file takes no step count")
        for name in ("averages", "searches"):
            if getattr(self, name) and (steps is not None or self.reads_file):
                raise ValueError(
                    f"{name}: a scorer of other methods takes no step count or file"
                )
        if self.averages and self.searches:
            raise ValueError("searches: a scorer either averages or searches")


_REGISTRY: Dict[str, Scorer] = {}
#: The scorers by name, read-only (:func:`register` adds one), in the order
#: they were registered.
SCORERS: Mapping[str, Scorer] = MappingProxyType(_REGISTRY)


def register(name: str, scorer: Scorer) -> None:
    r"""
    Adds a scorer to :data:`SCORERS`.

    Args:
        name (str): Its name on the command line: not empty, no ``:`` or
                    ``,``, not yet registered.
        scorer (Scorer): Its record.

    Raises:
        ValueError: If the name is empty, holds ``:`` or ``,``, or is taken.
        TypeError: If ``scorer`` is not a :class:`Scorer`.
    """
    if not isinstance(scorer, Scorer):
        raise TypeError(f"scorer: expected a Scorer, got {type(scorer).__name__}")
    if not name or ":" in name or "," in name:
        raise ValueError(f"name: expected a name without ':' or ',', got {name!r}")
    if name in _REGISTRY:
        raise ValueError(f"name: a scorer {name!r} is already registered")
    _REGISTRY[name] = scorer


def _scorer(name: str, **keywords: Any) -> _Later:
    return _Later("scorers", name, **keywords)


for _name, _record in (
    (
        "flow",
        Scorer(
            _Later("flow_scores", "flow_scores"),
            "the exact probability flow",
            DEFAULT_STEPS,
            check_steps=check_steps,
        ),
    ),
    (
        "flow-plain",
        Scorer(
            _Later("flow_scores", "flow_scores", method="first_order"),
            "the flow's first-order terms",
            DEFAULT_STEPS,
            check_steps=check_steps,
        ),
    ),
    (
        "effect",
        Scorer(
            _Later("flow_scores", "flow_scores", score="effect"),
            "each edge's own effect from the flow's walk",
            DEFAULT_STEPS,
            check_steps=check_steps,
        ),
    ),
    (
        "joint",
        Scorer(
            _Later("node_scores", "lifted_scores", path="joint"), "IG-Lens joint map"
        ),
    ),
    (
        "telescoping",
        Scorer(
            _Later("node_scores", "lifted_scores", path="telescoping"),
            "IG-Lens telescoping map",
        ),
    ),
    ("eap", Scorer(_scorer("eap"), "EAP")),
    ("eap-ig-inputs", Scorer(_scorer("eap_ig_inputs"), "EAP-IG on the inputs", 5)),
    (
        "eap-ig-activations",
        Scorer(_scorer("eap_ig_activations"), "EAP-IG on the activations", 5),
    ),
    ("random", Scorer(_scorer("random_scores"), "uniform random scores")),
    (
        "eap-json",
        Scorer(
            _Later("eap_json_scores", "eap_json_scores"),
            "an EAP-IG graph file's scores",
            reads_file=True,
        ),
    ),
    (
        "mean",
        Scorer(
            _Later("ensemble_scores", "mean_scores"),
            "the mean of its parts' signed rank-normalized scores",
            averages=True,
        ),
    ),
    (
        "search",
        Scorer(
            _Later("search", "search_scores"),
            "circuits searched against faithfulness on the --train pairs, "
            "from METHOD's scores there",
            searches=True,
        ),
    ),
    (
        "patching",
        Scorer(
            _scorer("patching"),
            "exact single-edge patching of --sample edges",
            truth=_scorer("sampled_edges"),
        ),
    ),
    (
        "patching-nodes",
        Scorer(
            _scorer("node_patching"),
            "exact patching of each node alone",
            truth=_scorer("node_totals"),
        ),
    ),
    (
        "patching-nodes-denoising",
        Scorer(
            _scorer("node_patching", denoising=True),
            "each node's clean writes alone in the counterfactual run",
            truth=_scorer("node_totals"),
        ),
    ),
):
    register(_name, _record)


def parse_method(text: str) -> Dict[str, Any]:
    r"""
    A method of the command line: a scorer's name, with a step count for the
    scorers that take one (``"eap-ig-inputs:20"``, else their default), a
    file for those that read one (``"eap-json:PATH"``; the path may hold
    ``:``), or two or more methods joined by ``+`` for those that average
    them (``"mean:eap+eap-ig-inputs:5"``, :func:`parse_parts`), or one
    method for those that search from its scores
    (``"search:eap-ig-inputs:5"``, :func:`parse_start`). Nothing is read.

    Args:
        text (str): The method.

    Returns:
        *dict* with ``name`` (the text), ``scorer``, ``steps`` (0 for a
        scorer without steps), ``path`` (None but for a file) and ``parts``
        (the parsed parts of an average, or a search's one method, else
        empty).

    Raises:
        ValueError: If the scorer is unknown, a step count is not a positive
            int in ASCII digits or is given to a scorer without steps, a
            file scorer has no path, or an average's parts or a search's
            method are refused (:func:`parse_parts`, :func:`parse_start`).
    """
    scorer, _, argument = text.partition(":")
    if scorer not in SCORERS:
        raise ValueError(
            f"--methods: expected names from {list(SCORERS)}, got {scorer!r}"
        )
    record = SCORERS[scorer]
    if record.averages or record.searches:
        parts = parse_parts(text) if record.averages else [parse_start(text)]
        return dict(name=text, scorer=scorer, steps=0, path=None, parts=parts)
    if record.reads_file:
        if not argument:
            raise ValueError(
                f"--methods: {scorer} scores a file, expected {scorer}:PATH, "
                f"got {text!r}"
            )
        return dict(name=text, scorer=scorer, steps=0, path=argument, parts=[])
    if argument and record.steps is None:
        raise ValueError(f"--methods: {scorer} takes no step count, got {text!r}")
    digits = argument.isascii() and argument.isdigit()
    if argument and (not digits or int(argument) < 1):
        raise ValueError(
            f"--methods: expected a positive step count in ASCII digits in {text!r}"
        )
    steps = int(argument) if argument else record.steps or 0
    if record.check_steps is not None:
        record.check_steps(steps, f"--methods: {text}")
    return dict(name=text, scorer=scorer, steps=steps, path=None, parts=[])


def parse_parts(text: str) -> List[Dict[str, Any]]:
    r"""
    The parts of an average, ``NAME:A+B[+C…]``: two or more methods as
    :func:`parse_method` takes them, each scored as circuits (no ground
    truth), reading no file, not an average itself, and no two the same
    scorer at the same step count (``eap-ig-inputs`` is
    ``eap-ig-inputs:5``).

    Args:
        text (str): The average's method text.

    Returns:
        *list[dict]*: :func:`parse_method`'s dict of each part, in order.

    Raises:
        ValueError: Naming ``--methods``, the average and the refused part.
    """
    scorer, _, argument = text.partition(":")
    texts = argument.split("+") if argument else []
    if len(texts) < 2:
        raise ValueError(
            f"--methods: {scorer} averages two or more methods, expected "
            f"{scorer}:A+B[+C...], got {text!r}"
        )
    parts: List[Dict[str, Any]] = []
    for part in texts:
        parsed = _inner_method(
            text,
            part,
            "holds the part",
            averages=f"itself an average; list every part in one {scorer}:A+B+...",
            searches="a search; score it as a method of its own",
            truth="a ground truth, not a method scored as circuits; "
            "average methods only",
            reads_file="which reads a file; score it as a method of its own",
        )
        twin = next((p for p in parts if method_key(p) == method_key(parsed)), None)
        if twin is not None:
            same = "" if twin["name"] == part else f" (as {twin['name']!r} too)"
            raise ValueError(
                f"--methods: {text!r} holds {part!r} twice{same}; list each part once"
            )
        parts.append(parsed)
    return parts


def parse_start(text: str) -> Dict[str, Any]:
    r"""
    The method a search starts from, ``NAME:METHOD``: one method as
    :func:`parse_method` takes it (an average included), scored as circuits
    (no ground truth), reading no file (its scores must come from the
    training pairs) and not a search itself.

    Args:
        text (str): The search's method text.

    Returns:
        *dict*: :func:`parse_method`'s dict of the method.

    Raises:
        ValueError: Naming ``--methods``, the search and the refused method.
    """
    scorer, _, argument = text.partition(":")
    if not argument:
        raise ValueError(
            f"--methods: {scorer} starts from a method's scores, expected "
            f"{scorer}:METHOD ({scorer}:eap-ig-inputs:5), got {text!r}"
        )
    return _inner_method(
        text,
        argument,
        "starts from",
        searches="itself a search; start from a method's scores",
        truth="a ground truth, not a method scored as circuits",
        reads_file="which reads a file; a search starts from scores of the "
        "training pairs",
    )


def _inner_method(
    text: str, inner: str, relation: str, **refused: str
) -> Dict[str, Any]:
    r"""
    ``inner``, a method inside the method ``text`` (an average's part, a
    search's start), parsed by :func:`parse_method`.

    Args:
        text (str): The outer method's text.
        inner (str): The inner method's text.
        relation (str): How the message relates them (``"starts from"``).
        **refused (str): For each kind of inner method refused here, of
                    ``averages``, ``searches``, ``truth`` and ``reads_file``
                    (the :class:`Scorer` fields), the message's end.

    Returns:
        *dict*: :func:`parse_method`'s dict of ``inner``.

    Raises:
        ValueError: ``--methods: 'TEXT' RELATION 'INNER', `` and the refusal's
            end, or :func:`parse_method`'s message in ``text``.
    """

    def refuse(kind: str) -> None:
        raise ValueError(f"--methods: {text!r} {relation} {inner!r}, {refused[kind]}")

    record = SCORERS.get(inner.partition(":")[0])
    for kind in ("averages", "searches"):
        if record is not None and kind in refused and getattr(record, kind):
            refuse(kind)
    try:
        parsed = parse_method(inner)
    except ValueError as error:
        problem = str(error).removeprefix("--methods: ")
        raise ValueError(f"--methods: in {text!r}, {problem}") from None
    record = SCORERS[parsed["scorer"]]
    if record.truth is not None:
        refuse("truth")
    if record.reads_file:
        refuse("reads_file")
    return parsed


def method_key(method: Dict[str, Any]) -> Tuple[str, int, Optional[str]]:
    r"""What a method that is not an average scores, whatever its text:
    ``(scorer, steps, path)`` (``eap-ig-inputs`` and ``eap-ig-inputs:5`` are
    one method)."""
    return method["scorer"], method["steps"], method["path"]


def method_identity(method: Dict[str, Any]) -> Hashable:
    r"""
    What a method scores, whatever its text: two methods of one identity
    give the same circuits. :func:`method_key` for a method of its own (a
    file by its real path); for an average, its parts' identities in any
    order (``mean:eap+flow`` is ``mean:flow+eap``); for a search, its
    start's.

    Args:
        method (dict): :func:`parse_method`'s dict.

    Returns:
        *Hashable*.
    """
    record = SCORERS[method["scorer"]]
    if record.averages:
        parts = sorted(repr(method_identity(p)) for p in method["parts"])
        return method["scorer"], tuple(parts)
    if record.searches:
        return method["scorer"], method_identity(method["parts"][0])
    scorer, steps, path = method_key(method)
    return scorer, steps, None if path is None else os.path.realpath(path)


def method_stem(method: Dict[str, Any]) -> str:
    r"""
    The file stem of a method's record in a resumable folder: its text with
    ``:`` as ``-``; for a method that reads a file, the scorer's name and the
    sha256 of the text and the file's bytes, so that a changed file is scored
    again, never resumed.

    Args:
        method (dict): :func:`parse_method`'s dict.

    Returns:
        *str*.
    """
    if method["path"] is None:
        return str(method["name"]).replace(":", "-")
    digest = hashlib.sha256(method["name"].encode() + b"\0")
    digest.update(Path(method["path"]).read_bytes())
    return f"{method['scorer']}-{digest.hexdigest()[:16]}"


def record_paths(out: Path, method: Dict[str, Any]) -> Tuple[Path, Path]:
    """A method's record in the folder ``out``: ``(its .json, its .pt)``."""
    stem = out / "methods" / method_stem(method)
    return Path(f"{stem}.json"), Path(f"{stem}.pt")


def record_error(path: Path, problem: str, text: str) -> ValueError:
    r"""The refusal of a file of the record of the method ``text`` that a rerun
    cannot resume: the file, what is wrong, and to delete the record."""
    stem = path.with_suffix("").name
    return ValueError(
        f"--out: {path}: {problem}; delete {stem}.json and {stem}.pt in "
        f"{path.parent} to score {text} again"
    )


def check_record(out: Path, text: str) -> None:
    r"""
    Refuses a method's record in the resumable folder ``out`` that a rerun
    could not resume, before the model loads: its ``.json`` not a JSON object
    of ``name``, ``curve`` (an object with :data:`CURVE`'s fields; null for a
    ground truth) and ``seconds``, or its ``.pt`` missing or not a complete
    archive. A method without a record passes.

    Args:
        out (Path): The folder.
        text (str): The method's text (:func:`parse_method`).

    Raises:
        ValueError: Naming the file, what is wrong, and to delete it.
    """
    method = parse_method(text)
    saved, scores = record_paths(out, method)
    if not saved.exists():
        return
    try:
        data = parse_json(saved.read_text(encoding="utf-8"), "")
    except (ValueError, UnicodeDecodeError) as error:
        problem = str(error).splitlines()[0].removeprefix(": ")
        raise record_error(saved, problem, text) from None
    truth = SCORERS[method["scorer"]].truth is not None
    curve = data.get("curve", ...) if isinstance(data, dict) else ...
    if truth:
        good_curve = curve is None
    else:
        good_curve = isinstance(curve, dict) and set(CURVE.fields) <= set(curve)
    if not isinstance(data, dict) or data.get("name") != text or not good_curve:
        expected = "null" if truth else f"an object of {list(CURVE.fields)}"
        problem = f"expected the record of {text}: name, curve ({expected}), seconds"
        raise record_error(saved, problem, text)
    if not scores.is_file():
        raise record_error(scores, "missing, the scores of its .json", text)
    try:
        with zipfile.ZipFile(scores) as archive:
            broken = archive.testzip()
    except (zipfile.BadZipFile, OSError):
        broken = scores.name
    if broken is not None:
        raise record_error(scores, "not a complete torch file", text)
