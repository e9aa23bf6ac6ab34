r"""Captum's LLM attribution pipeline, with layers in place of input tokens."""

import warnings
from typing import Any, Callable, Dict, List, Optional, Union

import torch
from captum._utils.typing import TokenizerLike
from captum.attr import LLMAttributionResult
from captum.attr._utils.attribution import Attribution
from captum.attr._utils.interpretable_input import TextTemplateInput, TextTokenInput
from torch import Tensor
from torch.nn import Module

from captum_iglens.attr._utils.checks import hf_model_of
from captum_iglens.attr.layer_ig_lens import LayerIGLens
from captum_iglens.hf.text import encode_answer, generate, teacher_forcing

__all__ = ["LLMLayerAttribution"]

#: Generation defaults, as in Captum's ``llm_attr.DEFAULT_GEN_ARGS``.
DEFAULT_GEN_ARGS: Dict[str, Any] = {
    "max_new_tokens": 25,
    "do_sample": False,
    "temperature": None,
    "top_p": None,
}


class LLMLayerAttribution(Attribution):
    r"""
    Layer-wise attribution of generated text, in the style of Captum's
    :class:`~captum.attr.LLMGradientAttribution`, returning Captum's own
    :class:`~captum.attr.LLMAttributionResult`.

    Where Captum's wrappers attribute each output token to the *input tokens*,
    this one attributes it to the *layers* of the model with
    :class:`~captum_iglens.LayerIGLens`, in probability space:

    - ``token_attr[i, j]`` (shape ``(n_output_tokens, n_layers)``) is layer
      ``j``'s IG-Lens credit to the probability of output token ``i``, i.e.
      ``f(h_{L_j}) - f(h_{L_{j-1}})`` at the position that predicts token ``i``:
      how much more probability of that token the model's final norm and head
      can read out of the residual stream after layer ``j`` than before it.
      Positive cells build the probability up, negative cells give it back.
    - Each row sums to ``Δp = p_model(token) - f(h_base)``, the token's
      probability minus its probability read out of the baseline (by default
      the input of the first block), exactly for the default
      ``"prediction_aware"`` estimator.
    - ``seq_attr[j]`` (shape ``(n_layers,)``) is the sum of column ``j`` over the
      output tokens.
    - ``input_tokens`` holds the *layer names* (the columns), so that Captum's
      ``plot_token_attr()`` and ``plot_seq_attr()`` label their axes with layers;
      ``output_tokens`` holds the output tokens as text.
    - ``output_probs`` holds the model's probabilities of the output tokens.

    The full :class:`~captum_iglens.IGLensResult` (logit-lens levels, baseline
    probabilities, deltas, onsets) is attached to the returned result as
    ``result.iglens``, e.g. for :func:`captum_iglens.plots.plot_trajectory`.

    Unlike Captum's wrappers, the attribution method is used as it is (no copy,
    no replaced ``forward_func``): each output token is attributed by teacher
    forcing in one forward pass over ``prompt + output``.

    Args:

        attr_method (LayerIGLens): The IG-Lens instance, e.g.
                    ``LayerIGLens.from_model(model)``.
        tokenizer (Tokenizer): The model's tokenizer. It must provide ``encode``
                    (with ``add_special_tokens`` and ``return_tensors="pt"``),
                    ``decode`` and ``convert_ids_to_tokens``; for readable output
                    tokens it should also be callable with
                    ``return_offsets_mapping=True``, as Hugging Face's fast
                    tokenizers are.

    Examples::

        >>> ig_lens = LayerIGLens.from_model(model)
        >>> llm_attr = LLMLayerAttribution(ig_lens, tokenizer)
        >>> inp = TextTokenInput("The capital of France is", tokenizer)
        >>> res = llm_attr.attribute(inp, target=" Paris")
        >>> res.token_attr  # (n_output_tokens, n_layers)
        >>> fig, ax = res.plot_token_attr()
    """

    SUPPORTED_METHODS = (LayerIGLens,)
    SUPPORTED_INPUTS = (TextTokenInput, TextTemplateInput)

    def __init__(self, attr_method: LayerIGLens, tokenizer: TokenizerLike) -> None:
        if not isinstance(attr_method, self.SUPPORTED_METHODS):
            raise TypeError(
                f"attr_method: {type(self).__name__} expects a "
                "captum_iglens.LayerIGLens, "
                f"got {type(attr_method).__name__}; for input-token attribution use "
                "captum.attr.LLMGradientAttribution"
            )
        if tokenizer is None or not callable(getattr(tokenizer, "encode", None)):
            raise TypeError(
                "tokenizer: expected a tokenizer with an encode() method, got "
                f"{type(tokenizer).__name__}"
            )
        super().__init__(attr_method.forward_func)
        self.attr_method: LayerIGLens = attr_method
        self.tokenizer: TokenizerLike = tokenizer
        #: The Hugging Face model used for generation, or None if none was found.
        self.model: Optional[Module] = _generator(attr_method.forward_func)
        self.device: torch.device = attr_method.readout.device

    def attribute(
        self,
        inp: Union[TextTokenInput, TextTemplateInput],
        target: Optional[Union[str, Tensor]] = None,
        *,
        gen_args: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> LLMAttributionResult:
        r"""
        Args:

            inp (TextTokenInput or TextTemplateInput): The prompt. Its full model
                        input is used (IG-Lens attributes to layers, so the
                        interpretable features and ``skip_tokens`` play no role).
            target (str or Tensor, optional): The output to attribute. A string
                        is tokenized without special tokens; a tensor holds its
                        token ids ``(n,)`` or ``(1, n)``. Each output token is
                        attributed at the position that predicts it, with the
                        prompt and the preceding output tokens as context
                        (teacher forcing). None: the model generates the output
                        greedily from the prompt. Default: None
            gen_args (dict, optional): Keyword only. Arguments of
                        ``model.generate`` when ``target`` is None, on top of
                        ``{"max_new_tokens": 25, "do_sample": False}``. Must be
                        None when ``target`` is given. Default: None
            **kwargs (Any): Passed to
                        :meth:`~captum_iglens.LayerIGLens.attribute_map`:
                        ``baselines``, ``method``, ``n_steps``,
                        ``internal_batch_size``, ``granularity`` (with
                        ``"source"`` or ``"source_head"`` the input tokens are
                        kept in ``.iglens.metadata["source_tokens"]``).

        Returns:
            *LLMAttributionResult* with ``token_attr`` of shape
            ``(n_output_tokens, n_layers)``, ``seq_attr`` of shape
            ``(n_layers,)``, ``input_tokens`` the layer names, ``output_tokens``
            the output tokens, ``output_probs`` the model's probabilities of
            the output tokens, and the :class:`~captum_iglens.IGLensResult` as
            ``.iglens``.
        """
        if not isinstance(inp, self.SUPPORTED_INPUTS):
            raise TypeError(
                "inp: expected a captum TextTokenInput or TextTemplateInput, got "
                f"{type(inp).__name__}"
            )
        for name in ("target", "positions", "additional_forward_args"):
            if name in kwargs:
                raise TypeError(
                    f"{name}: set by {type(self).__name__} (pass the output text as "
                    "`target`), not accepted as a keyword argument"
                )
        prompt = self._prompt_ids(inp)
        target_ids = self._target_ids(prompt, target, gen_args)
        n_prompt = prompt.shape[1]

        ids, positions, targets = teacher_forcing(prompt, target_ids)
        result = self.attr_method.attribute_map(
            ids, target=targets, positions=positions, **kwargs
        )
        output_tokens = self._pretty_tokens(target_ids)
        result.tokens = [list(output_tokens)]
        result.metadata = dict(result.metadata, prompt_length=n_prompt)
        if result.source_layout() is not None:  # granularity="source": the sources
            result.metadata["source_tokens"] = [self._pretty_tokens(ids[0])]

        token_attr = result.attributions[0]
        res = LLMAttributionResult(
            input_tokens=list(result.layer_names),
            output_tokens=output_tokens,
            seq_attr=token_attr.sum(0),
            token_attr=token_attr,
            output_probs=result.model_prob[0],
            inp=inp,
        )
        res.iglens = result
        return res

    def attribute_future(self) -> Callable[..., Any]:
        r"""This method is not implemented for LLMLayerAttribution."""
        raise NotImplementedError(
            "attribute_future is not implemented for LLMLayerAttribution"
        )

    # ------------------------------------------------------------------ internals

    def _prompt_ids(self, inp: Union[TextTokenInput, TextTemplateInput]) -> Tensor:
        model_input = inp.to_model_input()
        if isinstance(model_input, str):
            model_input = self.tokenizer.encode(model_input, return_tensors="pt")
        ids = torch.as_tensor(model_input)
        if ids.dim() == 1:
            ids = ids[None]
        if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
            raise ValueError(
                f"inp: expected one non-empty prompt, got token ids of shape "
                f"{tuple(ids.shape)}"
            )
        return ids.long().to(self.device)

    def _target_ids(
        self,
        prompt: Tensor,
        target: Optional[Union[str, Tensor]],
        gen_args: Optional[Dict[str, Any]],
    ) -> Tensor:
        if target is None:
            ids = self._generate(prompt, gen_args)
        else:
            if gen_args is not None:
                raise ValueError("gen_args: must be None when a target is given")
            if isinstance(target, str):
                ids = encode_answer(self.tokenizer, target)
            elif isinstance(target, Tensor):
                if target.is_floating_point() or target.dtype == torch.bool:
                    raise TypeError(
                        f"target: expected integer token ids, got dtype {target.dtype}"
                    )
                if target.dim() == 2 and target.shape[0] == 1:
                    target = target[0]
                if target.dim() != 1:
                    raise ValueError(
                        "target: expected token ids of shape (n,) or (1, n), got "
                        f"{tuple(target.shape)}"
                    )
                ids = target.long()
            else:
                raise TypeError(
                    "target: expected None, a string or a tensor of token ids, got "
                    f"{type(target).__name__}"
                )
        if ids.numel() == 0:
            raise ValueError(
                "target: the output to attribute has no tokens"
                + (" (the model generated none)" if target is None else "")
            )
        return ids.reshape(-1).to(self.device)

    def _generate(self, prompt: Tensor, gen_args: Optional[Dict[str, Any]]) -> Tensor:
        if self.model is None:
            raise ValueError(
                "target: None asks the model to generate the output, but no model "
                "with a generate() method was found behind attr_method.forward_func "
                f"({type(self.attr_method.forward_func).__name__}); pass the output "
                "text or token ids as target"
            )
        args = dict(DEFAULT_GEN_ARGS, **(gen_args or {}))
        (answer,) = generate(
            self.model,
            self.tokenizer,
            [prompt[0]],
            max_new_tokens=args.pop("max_new_tokens"),
            gen_args=args,
        )
        return answer

    def _pretty_tokens(self, ids: Tensor) -> List[str]:
        """Output tokens as text, the way Captum's LLM wrappers present them."""
        cpu = ids.cpu()
        try:
            from captum.attr._core.llm_attr import _convert_ids_to_pretty_tokens

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tokens = _convert_ids_to_pretty_tokens(cpu, self.tokenizer)
            if len(tokens) == len(cpu):
                return [str(t) for t in tokens]
        except Exception:  # a tokenizer without offsets, or a moved helper
            pass
        converted = self.tokenizer.convert_ids_to_tokens(cpu.tolist())
        return [str(t) for t in converted]


def _generator(forward_func: Callable[..., Any]) -> Optional[Module]:
    """The Hugging Face model behind ``forward_func``, which generates; or None."""
    try:
        return hf_model_of(forward_func)
    except TypeError:
        return None
