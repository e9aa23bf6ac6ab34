r"""
How two methods' edge scores differ, from the per-method records of
``benchmarks/circuits.py`` runs (``--out/MODEL-TASK/methods/NAME.pt``): their
Spearman correlation over every edge, the Jaccard overlap of their circuits
(absolute ranking, pruned) at each of MIB's sizes, and the sum of each one's
scores into ``logits`` (the exact flow's is the mean ``Δm`` over pairs).

    python benchmarks/circuits_compare.py runs/smollm2-ioi runs/gemma3-ioi \
        --methods flow:5 eap-ig-inputs
"""

import argparse
import sys
from pathlib import Path
from typing import List

import torch
from scipy.stats import spearmanr
from torch import Tensor

from captum_iglens.studies.circuits.faithfulness import PERCENTS, circuits
from captum_iglens.graph.circuit import legal_edges
from captum_iglens.graph.model_graph import ModelGraph, model_graph


def graph_of(scores: Tensor) -> ModelGraph:
    """The graph of ``(S, R)`` scores: ``S - 1 = L (H + 1)``, ``R - S = 2 L H``
    (grouped key/value heads change no edge)."""
    S, R = scores.shape
    heads_total = (R - S) // 2
    layers = S - 1 - heads_total
    return model_graph(layers, heads_total // layers)


def compare(folder: Path, methods: List[str]) -> str:
    """One line of the comparison of two methods' records in a run folder."""
    first, second = (
        torch.load(folder / "methods" / f"{m.replace(':', '-')}.pt", weights_only=True)
        for m in methods
    )
    graph = graph_of(first)
    legal = legal_edges(graph)
    rho = float(spearmanr(first[legal].numpy(), second[legal].numpy()).statistic)
    jaccard = [
        float((a & b).sum()) / max(float((a | b).sum()), 1.0)
        for a, b in zip(circuits(graph, first, True), circuits(graph, second, True))
    ]
    into = [float(s[legal[:, -1], -1].sum()) for s in (first, second)]
    return (
        f"| {folder.name} | {rho:+.2f} | "
        + " ".join(f"{j:.2f}" for j in jaccard[:-1])
        + f" | {into[0]:+.3f} | {into[1]:+.3f} |"
    )


def main() -> int:
    """Prints the Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--methods", nargs=2, default=["flow:5", "eap-ig-inputs"])
    args = parser.parse_args()
    a, b = args.methods
    sizes = " ".join(f"{p:g}%" for p in PERCENTS[:-1])
    print(
        f"| run | Spearman {a} vs {b} | Jaccard of circuits at {sizes} "
        f"| Σ into logits, {a} | Σ into logits, {b} |"
    )
    print("|---|---|---|---|---|")
    for folder in args.folders:
        print(compare(folder, args.methods))
    return 0


if __name__ == "__main__":
    sys.exit(main())
