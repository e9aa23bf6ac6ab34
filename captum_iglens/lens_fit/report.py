r"""
The report of a lens fit: per state, the held-out KL from the model's output and
the top-1 agreement with it, for the logit lens, the closed-form fit and (after
``--kl-steps``) the KL-tuned fit, side by side; the same for the closed form
fitted on fewer tokens (the token curve); as a table, a JSON file and a figure.
"""

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Tuple

import numpy as np

from captum_iglens._utils.serialization import write_atomic


@dataclass
class LensFitReport:
    r"""
    What a fit measured on its held-out rows.

    Attributes:

        model (str): The model's name.
        checksum (str): The sha256 of its weights.
        states (list[str]): ``L + 1`` labels: ``"emb"`` (``h_0``), then the block
                    whose output each state is.
        kl (dict[str, list[float]]): Per readout (``"logit"``, ``"fitted"``, and
                    ``"closed_form"`` beside ``"fitted"`` when tuned), the mean KL
                    in nats at each state.
        top1 (dict[str, list[float]]): The same keys, the top-1 agreement.
        curve (list[dict]): Per fitting size, ``{"tokens", "kl", "top1"}`` of the
                    closed form fitted on the first ``tokens`` rows.
        settings (dict): Corpus, tokens, ridge, seed, KL steps, seconds.
    """

    model: str
    checksum: str
    states: List[str]
    kl: Dict[str, List[float]]
    top1: Dict[str, List[float]]
    curve: List[Dict[str, Any]] = field(default_factory=list)
    settings: Dict[str, Any] = field(default_factory=dict)

    def fitted_below_logit(self) -> Tuple[int, int]:
        r"""How many states but the last have a lower mean KL under the fitted
        lens than under the logit lens, and of how many."""
        pairs = list(zip(self.kl["fitted"], self.kl["logit"]))[:-1]
        return sum(f < g for f, g in pairs), len(pairs)

    def format_table(self) -> str:
        r"""The per-state table, with the means over all states but the last."""
        kinds = [k for k in ("logit", "closed_form", "fitted") if k in self.kl]
        head = "state " + "".join(f"{'KL ' + k:>16}" for k in kinds)
        head += "".join(f"{'top1 ' + k:>18}" for k in kinds)
        lines = [head]
        for i, name in enumerate(self.states):
            cells = "".join(f"{self.kl[k][i]:16.3f}" for k in kinds)
            cells += "".join(f"{self.top1[k][i]:18.3f}" for k in kinds)
            lines.append(f"{name:<6}{cells}")
        means = "".join(f"{np.mean(self.kl[k][:-1]):16.3f}" for k in kinds)
        means += "".join(f"{np.mean(self.top1[k][:-1]):18.3f}" for k in kinds)
        lines.append(f"{'mean':<6}{means}   (over all states but the last)")
        below, total = self.fitted_below_logit()
        lines.append(
            f"fitted KL below the logit lens's at {below} of {total} states "
            f"(all but the last); {self.settings.get('fit_tokens')} fitting tokens, "
            f"{self.settings.get('eval_tokens')} held-out tokens"
        )
        for point in self.curve:
            lines.append(
                f"closed form on {point['tokens']:>6} tokens: mean KL "
                f"{np.mean(point['kl'][:-1]):.3f}, "
                f"top-1 {np.mean(point['top1'][:-1]):.3f}"
            )
        return "\n".join(lines)

    def to_dict(self) -> Dict[str, Any]:
        r"""The report as plain JSON-able data."""
        return asdict(self)

    def save(self, path: Any) -> None:
        r"""Writes the report as JSON, atomically."""
        write_atomic(path, json.dumps(self.to_dict(), indent=1))

    def plot(self) -> Tuple[Any, Any]:
        r"""
        The figure: KL (log scale) and top-1 agreement per state for each
        readout, and, with a token curve, the mean KL against fitting tokens.

        Returns:
            2-element tuple of the matplotlib **fig** and its **axes**.
        """
        from matplotlib.figure import Figure

        panels = 3 if self.curve else 2
        fig = Figure(figsize=(5 * panels, 4), layout="constrained")
        axes = fig.subplots(1, panels)
        x = np.arange(len(self.states) - 1)
        labels = {
            "logit": "logit lens",
            "closed_form": "closed form",
            "fitted": "fitted lens",
        }
        for kind, label in labels.items():
            if kind in self.kl:
                axes[0].plot(x, self.kl[kind][:-1], marker=".", label=label)
                axes[1].plot(x, self.top1[kind][:-1], marker=".", label=label)
        axes[0].set(
            yscale="log",
            ylabel="KL(model ‖ readout), nats",
            title=f"{self.model}: held-out KL",
        )
        axes[1].set(
            ylabel="top-1 agreement with the model",
            ylim=(0, 1),
            title="top-1 agreement",
        )
        ticks = x[:: max(1, len(x) // 10)]
        for ax in axes[:2]:
            ax.set_xticks(ticks, [self.states[i] for i in ticks])
            ax.set_xlabel("state (emb = h_0, else the block's output)")
            ax.legend()
        if self.curve:
            closed = self.kl.get("closed_form", self.kl["fitted"])
            tokens = [p["tokens"] for p in self.curve]
            tokens.append(self.settings.get("fit_tokens", tokens[-1]))
            kl = [np.mean(p["kl"][:-1]) for p in self.curve] + [np.mean(closed[:-1])]
            axes[2].plot(tokens, kl, marker="o")
            axes[2].set(
                xscale="log",
                xlabel="fitting tokens",
                ylabel="mean KL over states, nats",
                title="closed form vs fitting tokens",
            )
        return fig, axes
