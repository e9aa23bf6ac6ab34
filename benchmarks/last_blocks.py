r"""
What the last blocks do to the answer on the joint path: for each shipped fact
with a subject (the restoration study's), the model's greedy next token ``y``
and its runner-up ``c`` (the top-1 competitor) at the prompt's last position
get a joint-path map each (``path="joint"``); per block, over the facts:

- the mean share of ``y``'s ``|credit|``: ``credit_l / Σ_j |credit_j|``
  (negative: the block takes probability back);
- the mean credit to ``p(y)`` and to ``p(c)``, in probability, and how often
  the block lowers ``p(y)`` / raises ``p(c)``;
- the mean logit-lens level ``f(h_l)`` of ``y`` and ``c``.

    python benchmarks/last_blocks.py gemma3 [--blocks 6] [--batch 8] [--every N]
"""

import argparse
import time

import numpy as np
from captum_iglens import LayerIGLens
from captum_iglens.hf.models import load_embedded
from captum_iglens.hf.text import encode_prompt, left_pad, pad_token_id
from captum_iglens.studies.validation import load_facts


def _maps(lens, ids, mask, targets=None, top_k=0):
    """The joint map of ``targets`` (None: the greedy token) at the last
    position: credits ``(B, k)``, levels ``(B, k)`` and the result."""
    found = lens.attribute_map(
        ids,
        None,
        None if targets is None else targets[:, None],
        (mask,),
        positions=[ids.shape[1] - 1],
        path="joint",
        top_k=top_k,
    )
    return found.attributions[:, 0].double(), found.levels[:, 0].double(), found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", choices=("smollm2", "gemma3"))
    parser.add_argument("--blocks", type=int, default=6, help="last blocks shown")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--every", type=int, default=1, help="every N-th fact only")
    args = parser.parse_args()
    model, tokenizer = load_embedded(args.model, progress=False)
    lens = LayerIGLens.from_model(model)
    facts = [f for f in load_facts() if f.subject_span()][:: args.every]
    encoded = [encode_prompt(tokenizer, f.prompt, chat=False)[0] for f in facts]
    pad = pad_token_id(tokenizer)
    credits = {"y": [], "c": []}
    levels = {"y": [], "c": []}
    probs, residual = [], 0.0
    tick = time.perf_counter()
    for start in range(0, len(encoded), args.batch):
        ids, mask = left_pad(encoded[start : start + args.batch], pad)
        for key in ("y", "c"):
            if key == "y":
                scores, level, found = _maps(lens, ids, mask, top_k=2)
                # the model's own top two at the last block: y and its runner-up
                runner_up = found.top_ids[:, 0, -1, 1]
                probs.append(found.top_probs[:, 0, -1].double().numpy())
            else:
                scores, level, found = _maps(lens, ids, mask, runner_up)
            credits[key].append(scores.numpy())
            levels[key].append(level.numpy())
            gap = scores.sum(-1) - (found.model_prob - found.base_prob)[:, 0].double()
            residual = max(residual, float(gap.abs().max()))
    names = lens.layer_names
    y, c = (np.concatenate(credits[k]) for k in ("y", "c"))
    ly, lc = (np.concatenate(levels[k]) for k in ("y", "c"))
    p = np.concatenate(probs)
    share = y / np.abs(y).sum(-1, keepdims=True)
    print(
        f"{args.model}: {len(facts)} facts, joint path, {len(names)} blocks; "
        f"mean p(y) {p[:, 0].mean():.3f}, mean p(c) {p[:, 1].mean():.3f}; "
        f"max |Σ − Δp| {residual:.1e}; {time.perf_counter() - tick:.0f} s"
    )
    print(
        f"{'block':>6}{'share of |credit| (y)':>23}{'credit to p(y)':>16}"
        f"{'lowers p(y)':>13}{'credit to p(c)':>16}{'raises p(c)':>13}"
        f"{'f(h_l) y':>10}{'f(h_l) c':>10}"
    )
    for j in range(len(names) - args.blocks, len(names)):
        print(
            f"{names[j]:>6}{share[:, j].mean():>+23.3f}{y[:, j].mean():>+16.4f}"
            f"{np.mean(y[:, j] < 0):>13.2f}{c[:, j].mean():>+16.4f}"
            f"{np.mean(c[:, j] > 0):>13.2f}{ly[:, j].mean():>10.3f}"
            f"{lc[:, j].mean():>10.3f}"
        )


if __name__ == "__main__":
    main()
