r"""The readout ``R(h) = post(head(norm(h)))`` of a causal LM.

:class:`Readout` applies to one hidden vector exactly what the model applies
between its last block and its logits. It holds references to the model's own
modules, never copies, so it follows the model's devices and dtype.
:meth:`Readout.log_prob` evaluates ``log softmax(R(h))[y]`` for many rows in
chunks under a memory budget, without materialising all the logits.
"""

from typing import Callable, List, Optional

import torch
from torch import nn, Tensor

from captum_iglens._utils.offload import execution_device
from captum_iglens.readout.scores import TokenScore


class Readout(nn.Module):
    r"""The map from a last-block hidden state to the model's logits.

    ``Readout(h) = post(head(norm(h)))``: exactly what a causal LM does between
    the output of its last decoder block and its logits, and nothing else, so
    it acts on each token independently. This is the ``R`` of IG-Lens, and of
    the logit lens. It is the identity case of a readout per layer
    (:class:`~captum_iglens.readout.interface.LayerwiseReadout`, of kind
    ``"logit"``): it reads every state alike (it ignores ``layer``).

    The readout references the model's own modules: it copies no weights, stays
    on the model's devices, shares its dtype, and leaves its train/eval mode,
    ``requires_grad`` flags and hooks alone.

    Args:
        head (nn.Module): The unembedding, mapping ``(..., d')`` to ``(..., V)``
                    logits. It must expose ``out_features`` or a 2-D
                    ``weight`` of shape ``(V, d')``, from which
                    :attr:`vocab_size` is read.
        norm (nn.Module, optional): What the model applies to the last block's
                    output before the head: the final norm, followed by any
                    output projection (e.g. ``nn.Sequential(norm, project_out)``
                    for OPT-350m). ``None`` if the model applies nothing.
                    Default: None
        post (nn.Module, optional): What the model applies to the head's output,
                    e.g. :class:`Softcap` or :class:`LogitScale`. ``None`` if
                    nothing. Default: None
        max_chunk_bytes (int, optional): Memory budget of :meth:`log_prob`
                    and :meth:`score`: the ``(rows, V)`` arrays that one chunk of
                    rows holds at once (the float32 logits and their
                    log-softmax; in a backward, the gradients; a ``post``
                    transform's input beside its output) stay within this many
                    bytes (:meth:`rows_per_chunk`). Must be at least 1; a chunk
                    always holds at least one row. Default: 256 * 2**20
                    (256 MiB)

    Examples::

        >>> readout = model_parts(model).readout()  # captum_iglens.hf.model_parts
        >>> logits = readout(h_last)  # equals model(input_ids).logits
        >>> log_p = readout.log_prob(h_last.flatten(0, 1), targets.flatten())
    """

    def __init__(
        self,
        head: nn.Module,
        norm: Optional[nn.Module] = None,
        post: Optional[nn.Module] = None,
        *,
        max_chunk_bytes: int = 256 * 2**20,
    ) -> None:
        super().__init__()
        if not isinstance(head, nn.Module):
            raise TypeError(f"head must be an nn.Module, got {type(head).__name__}")
        for name, module in (("norm", norm), ("post", post)):
            if module is not None and not isinstance(module, nn.Module):
                raise TypeError(
                    f"{name} must be an nn.Module or None, got {type(module).__name__}"
                )
        if isinstance(max_chunk_bytes, bool) or not isinstance(max_chunk_bytes, int):
            raise TypeError(
                f"max_chunk_bytes must be an int, got {type(max_chunk_bytes).__name__}"
            )
        if max_chunk_bytes < 1:
            raise ValueError(
                f"max_chunk_bytes must be at least 1, got {max_chunk_bytes}"
            )
        self.norm = norm
        self.head = head
        self.post = post
        self.max_chunk_bytes = max_chunk_bytes
        self._vocab_size = _vocab_size(head)

    #: The readout's name in results: the logit lens.
    kind = "logit"

    @property
    def base(self) -> "Readout":
        r"""The model's own readout: this one."""
        return self

    @property
    def n_layers(self) -> int:
        r"""0: every state is read alike, as state 0 (see :meth:`state_index`)."""
        return 0

    def checksum(self) -> None:
        r"""None: the readout is the model's, which results identify otherwise."""
        return None

    def state_index(self, block: nn.Module) -> int:
        r"""0 for every block: the readout reads every state alike."""
        return 0

    def same(self, i: int, j: int) -> bool:
        r"""True: every state is read alike."""
        return True

    @property
    def vocab_size(self) -> int:
        r"""The number of logits ``V`` the head produces."""
        return self._vocab_size

    @property
    def device(self) -> torch.device:
        r"""The device of the readout's first weights (the norm's, else the
        head's; where accelerate offloads them, its hook's execution device):
        where captured states go."""
        return execution_device(self)

    def rows_per_chunk(self, backward: bool = False) -> int:
        r"""Returns how many rows :meth:`log_prob` and :meth:`score` evaluate at
        once, or, with ``backward``, how many rows a backward pass through them
        may take at once.

        Args:

            backward (bool, optional): Count what a backward pass keeps: autograd
                        holds the log-softmax (not the logits), and the backward
                        adds the gradient of the scores with respect to it and that
                        of the logits, three ``(rows, V)`` float32 tensors.
                        Default: False

        Returns:
            **rows** (int):
                The number of rows whose float32 logits and their log-softmax,
                ``rows * V * 8`` bytes (``rows * V * 12`` with ``backward``), fit
                in ``max_chunk_bytes``, with 4 more bytes a logit where a ``post``
                transform is set (its input and output coexist, and autograd
                keeps what its backward reads); at least 1.
        """
        per_logit = (12 if backward else 8) + (4 if self.post is not None else 0)
        return max(1, self.max_chunk_bytes // (per_logit * self.vocab_size))

    def forward(self, hidden: Tensor, layer: Optional[Tensor] = None) -> Tensor:
        r"""Maps hidden states to logits as the model does.

        Args:
            hidden (Tensor): Output of the model's last block (or any hidden
                        state read out as if it were), of shape ``(..., d)``, in
                        the model's dtype and on the norm's device.
            layer (Tensor, optional): The path point of each row (see
                        :class:`~captum_iglens.readout.interface.PathReadout`);
                        ignored: the model reads every layer the same way.
                        Default: None

        Returns:
            **logits** (Tensor):
                ``post(head(norm(hidden)))`` of shape ``(..., V)``, in the
                model's dtype: the model's own logits when ``hidden`` is its
                last block's output.
        """
        if self.norm is not None:
            hidden = self.norm(hidden)
        logits = self.head(hidden)
        if self.post is not None:
            logits = self.post(logits)
        return logits

    def log_prob(self, hidden: Tensor, target: Tensor) -> Tensor:
        r"""Log-probability of one target token per row, evaluated in chunks.

        Rows are read out :meth:`rows_per_chunk` at a time; each chunk's logits
        are upcast to float32 (float64 stays) before the log-softmax, and only
        the target's log-probability is kept, so all ``N x V`` logits never
        exist at once.
        The result is differentiable with respect to ``hidden`` when grad is
        enabled; autograd then keeps each chunk's log-softmax for the backward
        pass, so with grad the memory bound holds for at most
        ``rows_per_chunk(backward=True)`` rows a call.

        Args:
            hidden (Tensor): Hidden states of shape ``(N, d)``, as for
                        :meth:`forward`.
            target (Tensor): Token ids of shape ``(N,)``, dtype ``torch.long``,
                        in ``[0, V)``.

        Returns:
            **log_prob** (Tensor):
                ``log_softmax(R(hidden[i]))[target[i]]`` of shape ``(N,)``,
                float32 (float64 for a float64 model), on the head's output
                device.
        """
        if hidden.dim() != 2:
            raise ValueError(
                f"hidden must have shape (N, d), got {tuple(hidden.shape)}"
            )
        if target.dtype != torch.long:
            raise TypeError(f"target must be a torch.long tensor, got {target.dtype}")
        if target.shape != hidden.shape[:1]:
            raise ValueError(
                f"target must have shape ({hidden.shape[0]},) to match hidden, "
                f"got {tuple(target.shape)}"
            )
        return self._per_row(
            hidden, lambda logits, rows: target_log_prob(logits, target[rows])
        )

    def score(
        self, hidden: Tensor, score: TokenScore, layer: Optional[Tensor] = None
    ) -> Tensor:
        r"""The score ``Σ_{y∈S} p(y) − Σ_{y∈F} p(y)`` of each row, in chunks.

        As :meth:`log_prob`, with a :class:`~captum_iglens.readout.scores.TokenScore`
        in place of one target; for a single target it is exactly
        ``log_prob(hidden, target).exp()``.

        Args:
            hidden (Tensor): Hidden states of shape ``(N, d)``.
            score (TokenScore): ``(N, M)`` ids and signs.
            layer (Tensor, optional): ``(N,)``, the path point of each row;
                        ignored, as in :meth:`forward`. Default: None

        Returns:
            **score** (Tensor):
                ``(N,)`` float32 (float64 for a float64 model), differentiable
                with respect to ``hidden``.
        """
        if hidden.dim() != 2 or score.ids.shape[:1] != hidden.shape[:1]:
            raise ValueError(
                f"hidden must have shape (N, d) and score (N, M), got "
                f"{tuple(hidden.shape)} and {tuple(score.ids.shape)}"
            )
        return self._per_row(
            hidden,
            lambda logits, rows: score[rows].of(torch.log_softmax(logits, dim=-1)),
        )

    def _per_row(
        self, hidden: Tensor, reduce: Callable[[Tensor, slice], Tensor]
    ) -> Tensor:
        """``reduce(logits, rows)`` of each chunk of rows, concatenated: the
        logits upcast to float32 (float64 stays), one chunk alive at a time."""
        step = self.rows_per_chunk()
        chunks: List[Tensor] = []
        for start in range(0, hidden.shape[0], step):
            rows = slice(start, start + step)
            # No name keeps a chunk's logits alive while the next one is computed.
            logits = self(hidden[rows])
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
            chunks.append(reduce(logits, rows))
            del logits
        if not chunks:
            return hidden.new_zeros(
                (0,), dtype=torch.promote_types(hidden.dtype, torch.float32)
            )
        return torch.cat(chunks)

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, max_chunk_bytes={self.max_chunk_bytes}"


def target_log_prob(logits: Tensor, target: Tensor) -> Tensor:
    r"""``log_softmax(logits)[target]`` per row, in float32.

    :func:`torch.log_softmax` subtracts the row maximum first (``logit -
    logsumexp`` would lose about 1e-6 of absolute precision on large logits), and
    its ``exp`` agrees with :func:`torch.softmax` of the same logits to float
    precision, which is how users compute the model's probability.

    Args:
        logits (Tensor): ``(N, V)`` float32 logits.
        target (Tensor): ``(N,)`` token ids.

    Returns:
        **log_prob** (Tensor): ``(N,)`` float32.
    """
    target = target.to(logits.device).unsqueeze(-1)
    return torch.log_softmax(logits, dim=-1).gather(-1, target).squeeze(-1)


def _vocab_size(head: nn.Module) -> int:
    out_features = getattr(head, "out_features", None)
    if isinstance(out_features, int):
        return out_features
    weight = getattr(head, "weight", None)
    if isinstance(weight, Tensor) and weight.dim() == 2:
        return weight.shape[0]
    raise ValueError(
        f"head ({type(head).__name__}) must expose out_features or a 2-D weight "
        "of shape (V, d) from which the vocabulary size is read"
    )
