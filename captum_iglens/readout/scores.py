r"""
What IG-Lens attributes: the score ``f(h) = Σ_{y∈S} p(y) − Σ_{y∈F} p(y)`` of a
readout's distribution, for a target set ``S`` (one token by default) and an
optional foil set ``F`` (contrastive targets), and the per-row views of the
distribution (top-k, entropy, KL, rank) kept from the same log-softmax.

Both the map and the per-dimension estimators evaluate ``f`` through
:meth:`TokenScore.of`, so every credit telescopes to the change of the same score.
"""

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

#: ``foil=``: a token id, ``B`` ids (list or ``(B,)`` tensor), a ``(B, P)``
#: tensor, or a set of ids (every position).
FoilType = Union[None, int, list, set, frozenset, Tensor]
#: ``target_tokens=``: a set (or list, tuple, 1-D tensor) of ids, or a
#: ``(B, P, S)`` tensor padded with ``-1``.
TokenSetType = Union[None, set, frozenset, list, tuple, Tensor]

#: Padding of ragged token sets in ``target_sets`` and ``foils``.
PAD = -1
#: Elements compared at once when counting ranks (256 KiB of booleans, which
#: stay in the CPU's cache until they are counted).
_COUNT_ELEMENTS = 2**18
#: Vocabulary columns per block when selecting the top tokens.
_TOP_BLOCK = 64


@dataclass(frozen=True)
class TokenScore:
    r"""
    The score ``Σ_m signs[..., m] · p(ids[..., m])`` of every row.

    Attributes:

        ids (Tensor): ``(..., M)`` long token ids (``0`` under padding).
        signs (Tensor): ``(..., M)`` float32: ``+1`` for a target token, ``-1``
                    for a foil, ``0`` for padding.

    A single target ``y`` is ``ids = [y]``, ``signs = [1]``, whose score is
    ``exp(log_softmax(z)[y])``: the model's probability, computed as before.
    """

    ids: Tensor
    signs: Tensor

    @classmethod
    def build(
        cls,
        targets: Tensor,
        target_sets: Optional[Tensor] = None,
        foils: Optional[Tensor] = None,
    ) -> "TokenScore":
        r"""
        The score of ``targets`` ``(...)``, or of ``target_sets`` ``(..., S)`` in
        their place, minus ``foils`` ``(..., F)``; ``PAD`` entries are left out.
        """
        positive = targets[..., None] if target_sets is None else target_sets
        parts = [positive] if foils is None else [positive, foils]
        ids = torch.cat([p.to(targets.device) for p in parts], dim=-1)
        signs = torch.cat(
            [
                torch.full(p.shape, 1.0 if i == 0 else -1.0, device=targets.device)
                for i, p in enumerate(parts)
            ],
            dim=-1,
        )
        signs = signs.masked_fill(ids == PAD, 0.0)
        return cls(ids.clamp_min(0), signs)

    def __getitem__(self, index: Any) -> "TokenScore":
        return TokenScore(self.ids[index], self.signs[index])

    def flatten(self) -> "TokenScore":
        """One row per leading index: ``(N, M)``."""
        return TokenScore(
            self.ids.reshape(-1, self.ids.shape[-1]),
            self.signs.reshape(-1, self.signs.shape[-1]),
        )

    def repeat_interleave(self, repeats: int) -> "TokenScore":
        """Each row repeated ``repeats`` times, as ``Tensor.repeat_interleave``."""
        return TokenScore(
            self.ids.repeat_interleave(repeats, dim=0),
            self.signs.repeat_interleave(repeats, dim=0),
        )

    def of(self, log_probs: Tensor) -> Tensor:
        r"""
        The score of each row of ``log_probs`` ``(..., V)`` (a float32
        log-softmax): ``(...)`` float32, differentiable.
        """
        ids = self.ids.to(log_probs.device)
        picked = log_probs.gather(-1, ids).exp()
        return (picked * self.signs.to(log_probs.device)).sum(-1)

    def rank(self, log_probs: Tensor) -> Tensor:
        r"""
        The 1-based rank of the best-ranked target token (``signs > 0``) in each
        row of ``log_probs`` ``(..., V)``: ``1 +`` the number of tokens strictly
        more probable. ``(...)`` long.
        """
        ids = self.ids.to(log_probs.device)
        positive = self.signs.to(log_probs.device) > 0
        picked = log_probs.gather(-1, ids).masked_fill(~positive, -float("inf"))
        best = picked.amax(-1, keepdim=True)
        # A few rows at a time: the comparison and its int32 count stay small.
        step = max(1, _COUNT_ELEMENTS // max(1, log_probs.shape[-1]))
        above = [
            (log_probs[i : i + step] > best[i : i + step]).sum(-1, dtype=torch.int32)
            for i in range(0, log_probs.shape[0], step)
        ]
        if not above:
            return log_probs.new_ones(log_probs.shape[:-1], dtype=torch.long)
        return 1 + torch.cat(above).long()


@dataclass
class Views:
    r"""
    What a readout's distribution says at each row, beside the score.

    Attributes:

        top_ids (Tensor): ``(..., K)`` long, the ``K`` most probable tokens.
        top_probs (Tensor): ``(..., K)`` float32, their probabilities.
        entropy (Tensor): ``(...)`` float32, in nats.
        kl (Tensor): ``(...)`` float32, ``KL(final ‖ this)`` in nats.
        rank (Tensor): ``(...)`` long, 1-based rank of the target.
    """

    top_ids: Tensor
    top_probs: Tensor
    entropy: Tensor
    kl: Tensor
    rank: Tensor

    @classmethod
    def of(
        cls,
        log_probs: Tensor,
        score: TokenScore,
        top_k: int,
        final: Optional["FinalDistribution"],
        entropy: Optional[Tensor] = None,
    ) -> "Views":
        r"""
        The views of ``log_probs`` ``(N, V)``; ``final`` holds the model's final
        distribution of each row (None: the rows are the final distribution,
        and ``kl`` is zero). ``entropy`` ``(N,)``, where the caller has it from
        :func:`log_softmax_in_place` (its ``exp`` in memory no longer needed), is
        used as it is; without it the entropy costs one ``exp`` in fresh memory
        and a row product. Besides, the top-k
        costs one pass of block maxima (:func:`top_tokens`), the rank one
        comparison pass, and the KL one product and sum.
        """
        top_lp, top_ids = top_tokens(log_probs, top_k)
        if entropy is None:
            entropy = -log_probs.exp().mul_(log_probs).sum(-1)
        kl = torch.zeros_like(entropy) if final is None else final.kl(log_probs)
        return cls(top_ids, top_lp.exp(), entropy, kl, score.rank(log_probs))

    @classmethod
    def cat(cls, parts: Sequence["Views"], dim: int = 0) -> "Views":
        """The views of several parts, joined along a leading dimension."""
        return cls(
            *(torch.cat([getattr(p, name) for p in parts], dim) for name in _FIELDS)
        )

    def __getitem__(self, index: Any) -> "Views":
        """Every field indexed along its leading dimensions."""
        return Views(*(getattr(self, name)[index] for name in _FIELDS))

    def reshape(self, *shape: int) -> "Views":
        """Every field with leading shape ``shape`` (``top_*`` keep ``K``)."""
        return Views(
            self.top_ids.reshape(*shape, -1),
            self.top_probs.reshape(*shape, -1),
            self.entropy.reshape(shape),
            self.kl.reshape(shape),
            self.rank.reshape(shape),
        )


_FIELDS = ("top_ids", "top_probs", "entropy", "kl", "rank")


@dataclass
class FinalDistribution:
    r"""
    The model's final distributions of ``G`` positions, and which position each
    of ``N`` rows belongs to, for ``KL(final ‖ row)`` without a per-row copy.

    Attributes:

        probs (Tensor): ``(G, V)`` float32.
        neg_entropy (Tensor): ``(G,)`` float32, ``Σ q log q``.
        index (Tensor): ``(N,)`` long, each row's position in ``[0, G)``.
    """

    probs: Tensor
    neg_entropy: Tensor
    index: Tensor

    @classmethod
    def of(cls, log_probs: Tensor, index: Tensor) -> "FinalDistribution":
        """From the final log-probabilities ``(G, V)`` and the rows' positions."""
        probs = log_probs.exp()
        return cls(probs, (probs * log_probs).sum(-1), index)

    def kl(self, log_probs: Tensor) -> Tensor:
        r"""``KL(q ‖ p) = Σ q log q − Σ q log p`` of each row ``(N, V)`` against
        its position's ``q``: each run of rows of one position times its ``q``,
        a few rows at a time (the product stays in the CPU's cache), summed."""
        probs = self.probs.to(log_probs.dtype)  # float64 rows of a float64 model
        cross = log_probs.new_empty(log_probs.shape[0])
        step = max(1, _COUNT_ELEMENTS // max(1, log_probs.shape[-1]))
        positions, counts = torch.unique_consecutive(self.index, return_counts=True)
        start = 0
        for position, count in zip(positions.tolist(), counts.tolist()):
            for rows in range(start, start + count, step):
                part = slice(rows, min(rows + step, start + count))
                cross[part] = (log_probs[part] * probs[position]).sum(-1)
            start += count
        return self.neg_entropy[self.index] - cross


def top_tokens(log_probs: Tensor, k: int) -> Tuple[Tensor, Tensor]:
    r"""
    The ``k`` largest entries of each row of ``log_probs`` ``(N, V)``, as
    :meth:`torch.Tensor.topk` finds them (tied entries in no set order), from
    one pass over the rows instead of a selection over all of ``V``.

    Each row is cut into blocks of ``_TOP_BLOCK`` (64) columns; the ``k`` blocks
    with the largest maxima hold ``k`` entries at least as large as any entry
    outside them, so the ``k`` largest entries of those blocks (and of the
    columns after the last whole block) are the row's. A vocabulary of fewer
    than ``4 k`` blocks is searched whole.

    Returns:
        2-element tuple of *Tensor* ``(N, k)``, the entries in descending
        order, and *Tensor* ``(N, k)`` long, their columns.
    """
    rows, vocab = log_probs.shape
    n_blocks = vocab // _TOP_BLOCK
    if 4 * k > n_blocks:
        return log_probs.topk(k, dim=-1)
    whole = n_blocks * _TOP_BLOCK
    blocks = log_probs[:, :whole].unflatten(1, (n_blocks, _TOP_BLOCK))
    chosen = blocks.amax(-1).topk(k, dim=-1).indices  # (N, k)
    offsets = torch.arange(_TOP_BLOCK, device=log_probs.device)
    columns = (chosen[..., None] * _TOP_BLOCK + offsets).flatten(1)
    candidates = blocks.gather(1, chosen[..., None].expand(-1, -1, _TOP_BLOCK))
    candidates = candidates.flatten(1)
    if whole < vocab:  # the columns after the last whole block
        tail = torch.arange(whole, vocab, device=log_probs.device)
        columns = torch.cat([columns, tail.expand(rows, -1)], 1)
        candidates = torch.cat([candidates, log_probs[:, whole:]], 1)
    values, picked = candidates.topk(k, dim=-1)
    return values, columns.gather(1, picked)


def log_softmax_in_place(
    logits: Tensor, scratch: Optional[Tensor] = None, entropy: bool = False
) -> Tuple[Tensor, Optional[Tensor]]:
    r"""
    The log-softmax of ``logits`` ``(N, V)``, and with ``entropy`` the entropy
    of each row, without fresh ``(N, V)`` memory (whose page faults cost about
    twice the ``exp``) where ``scratch`` is given.

    The log-softmax is :func:`torch.log_softmax`'s, the kernel behind
    :func:`torch.softmax`, so probabilities agree with a user's
    ``logits.softmax(-1)`` and with the differentiable readout to float
    precision (an ``exp`` and row sum written out here differ from that kernel
    by up to about 1e-5 on a 49k vocabulary). It is written into ``scratch``, a
    contiguous ``(N, V)`` tensor like ``logits`` whose values are not needed
    (e.g. kept from an earlier chunk); ``logits``, no longer needed then, takes
    the ``exp`` of the entropy ``−Σ p log p``. Without ``scratch`` the
    log-softmax is new memory and ``logits`` is left as it is.

    Returns:
        2-element tuple of *Tensor* ``(N, V)``, the log-softmax (``scratch``
        where given), and *Tensor* ``(N,)``, the entropy in nats (None without
        ``entropy``).
    """
    usable = (
        scratch is not None
        and scratch.shape == logits.shape
        and scratch.dtype == logits.dtype
        and scratch.device == logits.device
        and scratch.is_contiguous()
    )
    if not usable:
        log_probs = torch.log_softmax(logits, -1)
        found = -log_probs.exp().mul_(log_probs).sum(-1) if entropy else None
        return log_probs, found
    log_probs = torch.log_softmax(logits, -1, out=scratch)
    found = (
        -torch.exp(log_probs, out=logits).mul_(log_probs).sum(-1) if entropy else None
    )
    return log_probs, found


def check_top_k(top_k: int, vocab: int) -> None:
    r"""``top_k`` must be an int in ``[0, V]``."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k: expected an int >= 0, got {top_k!r}")
    if top_k > vocab:
        raise ValueError(f"top_k: expected at most the vocabulary size {vocab}")


def resolve_token_sets(
    foil: FoilType,
    target_tokens: TokenSetType,
    batch: int,
    n_positions: int,
    vocab: int,
) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    r"""
    ``target_tokens=`` and ``foil=`` as ``(B, P, S)`` and ``(B, P, F)`` long
    tensors padded with :data:`PAD` (None where not given), checked before any
    hook is registered.

    Raises:
        TypeError, ValueError: Naming the argument: a wrong type or shape, an
            empty set, an id outside ``[0, V)``, or an id twice in one set.
    """
    sets = None
    if target_tokens is not None:
        sets = _token_set(target_tokens, "target_tokens", batch, n_positions, vocab)
    foils = None
    if foil is not None:
        if isinstance(foil, (set, frozenset)):
            foils = _token_set(foil, "foil", batch, n_positions, vocab)
        else:
            foils = _per_position(foil, batch, n_positions, vocab)
    return sets, foils


def _per_position(foil: Any, batch: int, n_positions: int, vocab: int) -> Tensor:
    """A foil id, per example or per position, as ``(B, P, 1)``."""
    if isinstance(foil, bool) or not isinstance(foil, (int, list, Tensor)):
        raise TypeError(
            "foil: expected a token id, a list of B ids, a (B,) or (B, P) tensor, "
            f"or a set of ids; got {type(foil).__name__}"
        )
    try:
        ids = torch.as_tensor(foil)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"foil: expected integer token ids, got {foil!r}") from None
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise TypeError(f"foil: expected integer token ids, got dtype {ids.dtype}")
    ids = per_position(ids, batch, n_positions, vocab, "foil", " or a set of ids")
    return ids.cpu()[..., None]


def _token_set(
    tokens: Any, name: str, batch: int, n_positions: int, vocab: int
) -> Tensor:
    """A set of ids (every position) or a ``(B, P, S)`` padded tensor."""
    if isinstance(tokens, Tensor) and tokens.dim() == 3:
        if tokens.is_floating_point() or tokens.dtype == torch.bool:
            raise TypeError(f"{name}: expected integer token ids, got {tokens.dtype}")
        if tuple(tokens.shape[:2]) != (batch, n_positions):
            raise ValueError(
                f"{name}: expected a set of ids or a ({batch}, {n_positions}, S) "
                f"tensor padded with {PAD}, got shape {tuple(tokens.shape)}"
            )
        ids = tokens.long().cpu()
    else:
        if isinstance(tokens, Tensor) and tokens.dim() == 1:
            tokens = tokens.tolist()
        if not isinstance(tokens, (set, frozenset, list, tuple)) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            raise TypeError(
                f"{name}: expected a set of int token ids (or a (B, P, S) tensor "
                f"padded with {PAD}), got {tokens!r}"
            )
        ids = torch.tensor(sorted(tokens), dtype=torch.long).reshape(-1)
        _check_range(ids, name, vocab)  # -1 pads only the tensor form
        if len(set(tokens)) != len(tokens):
            raise ValueError(f"{name}: expected distinct token ids, got {tokens!r}")
        ids = ids.expand(batch, n_positions, -1)
    real = ids != PAD
    if ids.shape[-1] == 0 or not real.any(-1).all():
        raise ValueError(f"{name}: expected at least one token id per position")
    _check_range(ids[real], name, vocab)
    ordered = ids.masked_fill(~real, PAD).sort(-1).values
    if ((ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] != PAD)).any():
        raise ValueError(f"{name}: expected distinct token ids in each set")
    return ids


def per_position(
    ids: Tensor, batch: int, n_positions: int, vocab: int, name: str, also: str = ""
) -> Tensor:
    r"""Token ids given once, once per example ``(B,)`` or once per attributed
    position ``(B, P)``, as a ``(B, P)`` LongTensor of ids checked against the
    vocabulary; ``also`` names further accepted forms in the error."""
    if ids.dim() == 0:
        ids = ids.expand(batch, n_positions)
    elif ids.dim() == 1 and ids.shape[0] == batch:
        ids = ids[:, None].expand(batch, n_positions)
    elif tuple(ids.shape) != (batch, n_positions):
        raise ValueError(
            f"{name}: expected a token id, {batch} ids (one per example) or a "
            f"({batch}, {n_positions}) tensor (one per attributed position){also}; "
            f"got shape {tuple(ids.shape)}"
        )
    _check_range(ids, name, vocab)
    return ids.long()


def _check_range(ids: Tensor, name: str, vocab: int) -> None:
    if ids.numel() and ((ids < 0) | (ids >= vocab)).any():
        raise ValueError(
            f"{name}: token ids must lie in [0, {vocab}), got min {int(ids.min())}, "
            f"max {int(ids.max())}"
        )
