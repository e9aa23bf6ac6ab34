"""Shared test helpers: hook snapshots, left-padded batches and circuit tasks."""

import json
import random
from typing import Dict, List, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from captum_iglens.hf import model_parts


def hook_snapshot(model: Module) -> Dict[str, Tuple[List[int], ...]]:
    """Every hook id on every submodule, to compare before and after a call."""
    return {
        name: tuple(
            list(getattr(m, attr).keys())
            for attr in (
                "_forward_hooks",
                "_forward_pre_hooks",
                "_backward_hooks",
                "_backward_pre_hooks",
            )
        )
        for name, m in model.named_modules()
    }


def state_snapshot(
    model: Module,
) -> Tuple[Dict[str, Tensor], Dict[str, bool], Dict[str, bool]]:
    """A copy of the weights, of every submodule's train/eval mode and of each
    parameter's ``requires_grad``."""
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    modes = {name: m.training for name, m in model.named_modules()}
    grads = {name: p.requires_grad for name, p in model.named_parameters()}
    return weights, modes, grads


def assert_state_unchanged(model: Module, snapshot) -> None:
    weights, modes, grads = snapshot
    now_weights, now_modes, now_grads = state_snapshot(model)
    assert now_modes == modes
    assert now_grads == grads
    assert weights.keys() == now_weights.keys()
    for key, value in weights.items():
        assert torch.equal(value, now_weights[key]), key


def left_padded(
    lengths: List[int], vocab: int, pad_id: int = 0
) -> Tuple[Tensor, Tensor]:
    """Random token ids ``(B, max(lengths))`` with left padding, and their mask."""
    total = max(lengths)
    ids = torch.full((len(lengths), total), pad_id, dtype=torch.long)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, total - length :] = torch.randint(1, vocab, (length,))
        mask[row, total - length :] = 1
    return ids, mask


def block_states(
    model: Module, ids: Tensor, mask: Tensor
) -> Tuple[List[Tensor], Tensor]:
    """Reference states from the test's own hooks: ``[h_0, h_1, ..., h_n]`` and the
    model's logits, from one forward with position ids counted from the mask."""
    blocks, states, handles = model_parts(model).blocks, [], []
    handles.append(
        blocks[0].register_forward_pre_hook(
            lambda m, a, k: states.append((a[0] if a else k["hidden_states"]).detach()),
            with_kwargs=True,
        )
    )
    for block in blocks:
        handles.append(
            block.register_forward_hook(
                lambda m, a, o: states.append(
                    (o[0] if isinstance(o, tuple) else o).detach()
                )
            )
        )
    try:
        with torch.no_grad():
            logits = model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            ).logits
    finally:
        for handle in handles:
            handle.remove()
    return states, logits


def word_tokenizer(vocab_size: int):
    """A word-level fast tokenizer over ``<pad> <s> </s> <unk> w4 ... w{V-1}``, with
    the ids of the tiny models' pad, BOS and EOS tokens (0, 1, 2)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, vocab_size)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def assert_heads_add_up_to_blocks(heads, blocks, tol: float = 1e-6) -> None:
    """Each block's head, bias and MLP columns (with ``"input"`` for the first
    block) of a ``granularity="head"`` map add up to that block's credit."""
    names = heads.layer_names
    for j, block in enumerate(blocks.layer_names):
        columns = [
            i
            for i, name in enumerate(names)
            if name.startswith(f"{block}.") or (j == 0 and name == "input")
        ]
        assert len(columns) >= 3, (block, names)
        total = heads.attributions[..., columns].sum(-1)
        assert (total - blocks.attributions[..., j]).abs().max() <= tol, block


def fixed_weights(model: Module) -> Module:
    """``model`` with every parameter and buffer set to values that no RNG or
    library version changes (``k/8`` for ``k = 0..6`` in turn, exact in any
    float dtype), so that a checksum of its weights can be a literal."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.is_floating_point():
                steps = torch.arange(tensor.numel(), dtype=torch.float64) % 7 / 8
                tensor.copy_(steps.reshape(tensor.shape))
    return model


def task_lines(folder, n: int) -> List[str]:
    """A circuit task's lines: ``n`` pairs of distinct prompts (words the
    tiny tokenizer keeps whole) for the model folder ``folder``, each answered
    by its model: its top token among t4-t9 as the answer, its last as the
    foil."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    rng = random.Random(0)
    lines = []
    for _ in range(n):
        ids = [rng.randint(40, 70) for _ in range(4)]
        other = list(ids)
        other[1] = rng.randint(71, 99)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([[1, *ids]])).logits[0, -1]
        top = [int(i) for i in logits.argsort(descending=True) if 3 < int(i) < 10]
        lines.append(
            json.dumps(
                dict(
                    clean=" ".join(f"t{i}" for i in ids),
                    counterfactual=" ".join(f"t{i}" for i in other),
                    answer=f"t{top[0]}",
                    foil=f"t{top[-1]}",
                )
            )
        )
    return lines
