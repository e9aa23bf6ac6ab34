r"""
The graphs of a pair file (:mod:`~captum_iglens.studies.pair_file`) in a
folder, ``graph --pairs``: every row planned before any forward, one graph file
a row (``OUT/graphs/<id>.json``) written atomically as it is done, a rerun
resuming where a run stopped (even after ``kill -9``) and the rows shared
across the processes of ``torchrun``, the files byte for byte those of one
uninterrupted process. The run's identity is in ``OUT/run.json``
(:func:`~captum_iglens.studies.batch.resume.claim_run`), the folder's lock in
``OUT/.batch.lock`` (:class:`~captum_iglens.studies.batch.BatchLock`).
"""

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from tqdm import tqdm

from captum_iglens._utils.output_paths import check_folder
from captum_iglens._utils.serialization import plain, remove_partials
from captum_iglens.attr.flow import ProbabilityFlow
from captum_iglens.attr.flow.probability_flow import FlowPlan
from captum_iglens.hf.checksum import weights_checksum
from captum_iglens.settings import model_name, provenance, Settings
from captum_iglens.studies.distributed import (
    barrier,
    from_rank_zero,
    gathered,
    rank_and_world,
)
from captum_iglens.studies.batch.lock import BatchLock
from captum_iglens.studies.batch.resume import (
    RUN,
    check_run,
    claim_run,
    compare_run,
    read_run,
)
from captum_iglens.studies.pair_file import (
    GraphPair,
    as_pairs,
    pair_arguments,
    pairs_checksum,
)

#: The folder of a run's graph files, in its ``out_dir``.
GRAPHS = "graphs"


@dataclass(frozen=True)
class GraphsPlan:
    r"""
    The graphs of a pair file, planned by :func:`plan_graphs`; run them with
    :func:`run_graphs`.

    Args:
        flow (ProbabilityFlow): The flow of the model.
        pairs (list[GraphPair]): The rows.
        plans (list[FlowPlan]): Each row's planned graph.
        out (Path): The output folder.
        run (dict): The run's identity, as ``run.json`` records it.
        weights (str): The model's
                    :func:`~captum_iglens.hf.checksum.weights_checksum`,
                    computed once for the check and the claim of the run.
        keep (float, optional): The share of ``|flow|`` each file keeps
                    (``FlowGraph.prune``); None keeps every edge.
    """

    flow: ProbabilityFlow
    pairs: List[GraphPair]
    plans: List[FlowPlan]
    out: Path
    run: Dict[str, Any]
    weights: str
    keep: Optional[float]

    def path(self, pair: GraphPair) -> Path:
        r"""The graph file of ``pair``."""
        return self.out / GRAPHS / f"{pair.name}.json"


def graph_pairs(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[Any],
    out_dir: Union[str, Path],
    *,
    keep: Optional[float] = None,
    progress: bool = True,
    **options: Any,
) -> Path:
    r"""
    The probability-flow graph of every row of a pair file, one file a row, in
    ``out_dir/graphs/<id>.json`` (``FlowGraph.save``'s file; read it with
    ``FlowGraph.load``).

    Resumable: a row whose file exists is not redone, and a file is written
    atomically, so a run killed at any point (``kill -9`` included) and rerun
    leaves the files an uninterrupted run writes, byte for byte. The options,
    the rows (their checksum), the model's weights and the arithmetic (the
    device, and the CPU threads per process or the GPU's name, on which the
    last bits of a float sum depend) are recorded in ``out_dir/run.json``; a
    rerun under any other is refused before any forward.

    When ``torch.distributed`` is initialised (see
    :func:`~captum_iglens.studies.batch.init_distributed`), rank 0 claims the
    folder and finds the rows left, and each process computes every
    ``world_size``-th of them; the files are those of one process with the
    same arithmetic (under ``torchrun``, one CPU thread per process unless
    ``OMP_NUM_THREADS`` says otherwise).

    Args:

        model (PreTrainedModel): A causal LM that
                    :class:`~captum_iglens.attr.flow.ProbabilityFlow` supports,
                    on the device to use, or its
                    :func:`~captum_iglens.hf.model_parts`.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        pairs (list): The rows: :class:`~captum_iglens.studies.pair_file.GraphPair`
                    objects (:func:`~captum_iglens.studies.pair_file.read_pairs`)
                    or dicts of their fields.
        out_dir (str or Path): The output folder, created if missing (its
                    parent must exist).
        keep (float, optional): Write each graph pruned to the smallest edge
                    set carrying this share of ``|flow|``, in ``(0, 1]``.
                    Default: None (every edge)
        progress (bool, optional): A progress bar on stderr (rank 0 only).
                    Default: True
        **options (Any): The arguments of
                    :meth:`~captum_iglens.attr.flow.ProbabilityFlow.attribute`
                    but ``inputs``, for every row; a row's own
                    ``counterfactual`` or ``corrupt_subject``, ``target`` and
                    ``foil`` take their place. ``baselines`` must be a name.

    Returns:
        *Path*: ``out_dir/graphs``.

    Raises:
        ValueError: Naming the row (``"pairs[2]: ..."``, or the file and line)
            or the argument, before any forward.
    """
    plan = plan_graphs(model, tokenizer, pairs, out_dir, keep=keep, **options)
    return run_graphs(plan, progress=progress)


def plan_graphs(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[Any],
    out_dir: Union[str, Path],
    *,
    keep: Optional[float] = None,
    **options: Any,
) -> GraphsPlan:
    r"""
    The part of :func:`graph_pairs` before any forward: every row planned
    (:meth:`ProbabilityFlow.plan`), the folder checked and, where it holds a
    run, the run checked against it (the weights' checksum included).

    Args:

        model (PreTrainedModel): As in :func:`graph_pairs`.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        pairs (list): The rows, as in :func:`graph_pairs`.
        out_dir (str or Path): The output folder (it need not exist yet).
        keep (float, optional): As in :func:`graph_pairs`. Default: None
        **options (Any): As in :func:`graph_pairs`.

    Returns:
        *GraphsPlan*: every row's plan, the run's record and the weights'
        checksum, for :func:`run_graphs`.

    Raises:
        ValueError: As :func:`graph_pairs`.
    """
    rows = as_pairs(pairs)
    flow = ProbabilityFlow(model, tokenizer)
    record = graph_record(rows, keep, options)
    arguments = {k: v for k, v in record["graph"].items() if k != "keep"}
    plans = []
    for pair in rows:
        row = pair_arguments(pair, arguments)
        try:
            plans.append(flow.plan(**row))
        except (ValueError, TypeError) as error:
            raise type(error)(f"{pair.where}: {error}") from None
    out = check_folder(out_dir, "out_dir")
    model = flow.parts.model
    name = model_name(getattr(model.config, "_name_or_path", ""))
    run = {
        **record,
        # what every file records as settings.model, and its arithmetic
        "graph_model": name,
        "arithmetic": _arithmetic(model),
        "model": name,
        "versions": provenance(model, Settings())["versions"],
    }
    weights = weights_checksum(model)
    check_run(out, run, model, weights)
    return GraphsPlan(flow, rows, plans, out, plain(run), weights, keep)


def graph_record(
    pairs: Sequence[GraphPair], keep: Optional[float], options: Dict[str, Any]
) -> Dict[str, Any]:
    r"""
    What identifies a run of :func:`graph_pairs` before the model loads: every
    argument of the flow (``options``, the others at their defaults) and
    ``keep`` as ``"graph"``, the rows' count and checksum as ``"pairs"``.

    Args:

        pairs (list[GraphPair]): The rows.
        keep (float, optional): The share of ``|flow|`` each file keeps; None
                    keeps every edge.
        options (dict): The arguments of the flow given, as in
                    :func:`graph_pairs`.

    Returns:
        *dict*: ``{"graph": {...}, "pairs": {"rows": n, "checksum": ...}}``,
        plain JSON values.

    Raises:
        TypeError: If an option is not an argument of the flow.
        ValueError: If ``baselines`` is not a name or ``keep`` is not a share.
    """
    parameters = inspect.signature(ProbabilityFlow.plan).parameters
    defaults = {
        name: parameter.default
        for name, parameter in parameters.items()
        if name not in ("self", "inputs")
    }
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise TypeError(f"graph_pairs: not arguments of the flow: {unknown}")
    arguments = {**defaults, **options}
    if not isinstance(arguments["baselines"], str):
        raise ValueError("baselines: expected 'pad' or 'mean' for a pair file")
    share = isinstance(keep, (int, float)) and not isinstance(keep, bool)
    if keep is not None and not (share and 0 < keep <= 1):
        raise ValueError(f"keep: expected a share in (0, 1], got {keep!r}")
    return plain(
        {
            "graph": {**arguments, "keep": keep},
            "pairs": {"rows": len(pairs), "checksum": pairs_checksum(pairs)},
        }
    )


def check_graph_run(
    out_dir: Union[str, Path],
    pairs: Sequence[GraphPair],
    keep: Optional[float] = None,
    **options: Any,
) -> None:
    r"""
    The checks of a rerun in ``out_dir`` that need no model, for a caller that
    loads it afterwards (the command line): the options and rows against
    ``run.json`` (:func:`graph_record`); :func:`plan_graphs` makes them again
    with the model's.

    Args:

        out_dir (str or Path): The output folder (it need not exist).
        pairs (list[GraphPair]): The rows.
        keep (float, optional): As in :func:`graph_pairs`. Default: None
        **options (Any): As in :func:`graph_pairs`.

    Raises:
        ValueError: If they differ, or the folder holds graphs but no
            ``run.json``.
    """
    out = Path(out_dir)
    if (out / RUN).exists():
        compare_run(out, read_run(out), graph_record(pairs, keep, options))
    elif any((out / GRAPHS).glob("*.json")):
        raise ValueError(
            f"out_dir: {out} holds graphs but no {RUN}, so their options are "
            "unknown; choose a new --out folder"
        )


def run_graphs(plan: GraphsPlan, progress: bool = True) -> Path:
    r"""
    The graphs of a :func:`plan_graphs`, written as :func:`graph_pairs` says:
    rank 0 takes the folder's lock, records or checks the run, removes what
    a killed write left and finds the rows without a file; every process
    computes its share of them; rank 0 releases the lock once all are done.

    Args:

        plan (GraphsPlan): The plan of :func:`plan_graphs`, made on every
                    process.
        progress (bool, optional): A progress bar on stderr (rank 0 only).
                    Default: True

    Returns:
        *Path*: ``out/graphs``.

    Raises:
        ValueError: If the processes compute with different arithmetic, the
            folder is another run's or its ``run.json`` differs from the plan's.
    """
    out, folder = plan.out, plan.out / GRAPHS
    lock = BatchLock(out)
    arithmetic = gathered(plan.run["arithmetic"])  # each process's plan's

    def claim() -> List[int]:
        if len(set(arithmetic)) > 1:
            raise ValueError(
                f"out_dir: the processes compute with different arithmetic "
                f"{sorted(set(arithmetic))}; their files would differ in the "
                "last bits. Give every process the same OMP_NUM_THREADS (or GPU)"
            )
        out.mkdir(exist_ok=True)
        lock.acquire()
        remove_partials(out)  # a run.json whose write was killed
        folder.mkdir(exist_ok=True)
        files = sorted(folder.glob("*.json"))
        claim_run(out, plan.run, plan.flow.parts.model, files, plan.weights)
        remove_partials(folder)
        return [i for i, pair in enumerate(plan.pairs) if not plan.path(pair).exists()]

    try:
        left = from_rank_zero(claim)
        rank, world = rank_and_world()
        own = left[rank::world]
        bar = tqdm(own, desc="graphs", unit="graph", disable=not progress or rank != 0)
        for index in bar:
            graph = plan.flow.run(plan.plans[index])
            kept = graph if plan.keep is None else graph.prune(plan.keep)
            kept.save(plan.path(plan.pairs[index]))
        barrier()  # the lock is released once every process is done
    finally:
        lock.release()
    return folder


def _arithmetic(model: Any) -> str:
    """What the last bits of the model's sums depend on: the device, and the
    CPU threads of this process or the GPU's name."""
    device = next(model.parameters()).device
    if device.type == "cuda":
        return f"cuda, {torch.cuda.get_device_name(device)}"
    if device.type == "cpu":
        threads = torch.get_num_threads()
        return f"cpu, {threads} thread{'s' if threads > 1 else ''}"
    return device.type
