r"""
The target ``m`` the flow and the circuit harness attribute, in one place: its
kinds (``p(y)``, ``p(y) − p(foil)``, ``logit(y) − logit(foil)``), the rule for
its foil, how a target token is resolved from text or an id, and ``m`` itself
(:func:`metric`). Importing it costs no torch, so the command line checks its
options before anything heavy loads.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Union

if TYPE_CHECKING:
    from torch import Tensor

#: The kinds of ``m``: ``p(y)``, ``p(y) − p(foil)``, ``logit(y) − logit(foil)``.
TARGETS = ("prob", "prob_diff", "logit_diff")
#: How ``Target.describe`` writes each kind, ``{y}`` and ``{f}`` the tokens' texts.
FORMULAS = {
    "prob": "p({y})",
    "prob_diff": "p({y}) - p({f})",
    "logit_diff": "logit({y}) - logit({f})",
}
#: The argument names of the messages, as the Python API spells them.
API_NAMES = {"kind": "target_kind", "foil": "foil", "counterfactual": "counterfactual"}


def check_kind(kind: Any, names: Mapping[str, str] = API_NAMES) -> None:
    """Refuses a kind of ``m`` that is not one of :data:`TARGETS`."""
    if kind not in TARGETS:
        raise ValueError(f"{names['kind']}: expected one of {TARGETS}, got {kind!r}")


def takes_foil(kind: str) -> bool:
    """Whether ``m`` of this kind reads a foil token (the differences do)."""
    return kind != "prob"


def check_foil(
    kind: str,
    foil_given: bool,
    foil_from_counterfactual: bool = False,
    names: Mapping[str, str] = API_NAMES,
) -> None:
    r"""
    The foil rule: ``prob`` takes no foil; the differences need one, given or
    taken from the counterfactual prompt's prediction.

    Args:
        kind (str): The kind of ``m``.
        foil_given (bool): A foil token was given.
        foil_from_counterfactual (bool, optional): A counterfactual prompt
                    whose prediction can be the foil is there. Default: False
        names (Mapping[str, str], optional): The caller's names of ``kind``,
                    ``foil`` and ``counterfactual`` for the messages (the
                    command line's options). Default: the Python API's

    Raises:
        ValueError: Naming the foil, where the rule is broken.
    """
    kind_name, foil_name = names["kind"], names["foil"]
    if not takes_foil(kind) and foil_given:
        raise ValueError(f"{foil_name}: {kind_name} {kind!r} takes no foil")
    if takes_foil(kind) and not (foil_given or foil_from_counterfactual):
        raise ValueError(
            f"{foil_name}: {kind_name} {kind!r} needs a foil token, or a "
            f"{names['counterfactual']} prompt whose prediction is the foil"
        )


def resolve_token(
    token: Union[None, int, str], name: str, tokenizer: Any, vocab_size: int
) -> Optional[int]:
    r"""
    A target or foil token as an id.

    Args:
        token (int, str or None): An id, or the text of one token.
        name (str): The argument's name, for messages.
        tokenizer (PreTrainedTokenizerBase or None): For text.
        vocab_size (int): The model's vocabulary.

    Returns:
        *int* or None (for None).

    Raises:
        ValueError: For text without a tokenizer, text of several tokens, or
            an id outside the vocabulary.
    """
    if token is None:
        return None
    if isinstance(token, str):
        if tokenizer is None:
            raise ValueError(f"{name}: text needs a tokenizer; pass a token id")
        found = tokenizer.encode(token, add_special_tokens=False)
        if len(found) != 1:
            raise ValueError(
                f"{name}: {token!r} is {len(found)} tokens, expected one (pass "
                "the text of a single token, or its id)"
            )
        return int(found[0])
    if (
        isinstance(token, bool)
        or not isinstance(token, int)
        or not 0 <= token < vocab_size
    ):
        raise ValueError(
            f"{name}: expected a token id in [0, {vocab_size}) or text, got {token!r}"
        )
    return token


def metric(kind: str, logits: "Tensor", answer: "Tensor", foil: "Tensor") -> "Tensor":
    r"""
    ``m`` of rows of logits.

    Args:
        kind (str): One of :data:`TARGETS`.
        logits (Tensor): ``(B, V)``.
        answer (Tensor): ``(B,)`` long: each row's target token ``y``.
        foil (Tensor): ``(B,)`` long: each row's foil (not read for ``prob``).

    Returns:
        *Tensor* ``(B,)`` float32.
    """
    import torch

    logits = logits.float()
    values = logits if kind == "logit_diff" else torch.softmax(logits, -1)
    picked = values.gather(1, answer[:, None])[:, 0]
    if not takes_foil(kind):
        return picked
    return picked - values.gather(1, foil[:, None])[:, 0]


@dataclass(frozen=True)
class Target:
    r"""
    The target ``m`` at one position: what a flow attributes.

    Args:
        kind (str): One of :data:`TARGETS`.
        token (int): The token ``y``.
        position (int): The position ``t`` whose logits are read (non-negative).
        foil (int, optional): The foil token, for the differences. Default: None
    """

    kind: str
    token: int
    position: int
    foil: Optional[int] = None

    def __post_init__(self) -> None:
        check_kind(self.kind)
        check_foil(self.kind, self.foil is not None)
        if self.foil is not None and self.foil == self.token:
            raise ValueError(f"foil: must differ from the target token {self.token}")

    def __call__(self, logits: "Tensor") -> "Tensor":
        r"""
        Args:
            logits (Tensor): ``(P, T, V)``.

        Returns:
            *Tensor* ``(P,)`` float32: ``m`` per row.
        """
        return self.of_row(logits[:, self.position])

    def of_row(self, row: "Tensor") -> "Tensor":
        r"""
        Args:
            row (Tensor): ``(P, V)``: the logits at ``position``.

        Returns:
            *Tensor* ``(P,)`` float32: ``m`` per row.
        """
        return rows_metric([self] * row.shape[0], row)

    def describe(self, text: Callable[[int], str]) -> str:
        """``m`` in words, each token written by ``text``: ``p(' Mary')``."""
        foil = "" if self.foil is None else text(self.foil)
        return FORMULAS[self.kind].format(y=text(self.token), f=foil)


def rows_metric(targets: Sequence[Target], row: "Tensor") -> "Tensor":
    r"""
    ``m`` of rows of logits, each row read by its own target (a batch of pairs
    whose tokens differ).

    Args:
        targets (Sequence[Target]): One per row, of one kind and position.
        row (Tensor): ``(P, V)``: the logits at their position.

    Returns:
        *Tensor* ``(P,)`` float32.
    """
    import torch

    kinds = {(target.kind, target.position) for target in targets}
    assert len(kinds) == 1 and len(targets) == row.shape[0], (kinds, len(targets))
    answer = torch.tensor([t.token for t in targets], device=row.device)
    foil = torch.tensor(
        [t.token if t.foil is None else t.foil for t in targets], device=row.device
    )
    return metric(kinds.pop()[0], row, answer, foil)
