r"""
Where " Paris" gets its probability from, per source token, on an embedded
model, beside Captum's input-token attribution:

    python benchmarks/source_routes.py --model smollm2
    python benchmarks/source_routes.py --model gemma3

Attributes the model's answer to "What is the capital of France?" with
``granularity="source_head"`` and prints, for the answer token " Paris", the
top routes source → block.head, the top sources (credit summed over blocks and
heads), how the token's Δp splits into attention (sources, bias) and MLP, and
Spearman's rank agreement, over the source positions up to the token, of the
per-source credits with Captum's ``LayerIntegratedGradients`` on the embedding
layer (the token's probability, baseline token id 0, summed over the hidden
dimension, ``n_steps=50``).
"""

import argparse
import time

import torch
from captum.attr import LayerIntegratedGradients

from captum_iglens.attr import attribute_text
from captum_iglens.hf.models import load_embedded
from captum_iglens.hf.text import answered_prompt

PROMPT = "What is the capital of France?"
TOKEN = " Paris"


def _ranks(x: torch.Tensor) -> torch.Tensor:
    return x.argsort().argsort().double()


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation (no ties expected in float credits)."""
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--n-steps", type=int, default=50)
    args = parser.parse_args()
    model, tokenizer = load_embedded(args.model)
    ids, _, _, answer_ids = answered_prompt(model, tokenizer, PROMPT)
    start = time.perf_counter()
    result = attribute_text(
        model,
        tokenizer,
        PROMPT,
        answer=answer_ids,
        granularity="source_head",
        n_steps=args.n_steps,
    )
    seconds = time.perf_counter() - start
    tokens = result.tokens[0]
    p = tokens.index(TOKEN)
    print(
        f"{args.model}: answer {result.metadata['answer']!r}, source_head map "
        f"in {seconds:.1f} s, max |Σ - Δp| = {result.delta.abs().max():.2e}"
    )
    print(result.select(positions=[p]).format_sources(top=8))
    cells = result.source_map(by_head=True)[0, p]  # (k, H, T)
    layout = result.source_layout()
    row = result.attributions[0, p]
    bias = sum(float(row[i]) for i in layout.bias if i is not None)
    mlp = float(row[layout.mlp].sum())
    change = float(result.model_prob[0, p] - result.base_prob[0, p])
    print(
        f"Δp {change:+.4f} = attention from sources {float(cells.sum()):+.4f} "
        f"+ attention bias {bias:+.4f} + MLPs {mlp:+.4f} "
        f"+ input {float(row[0]):+.4f}"
    )

    position = int(result.positions[p])
    ids = ids[:, : position + 1]
    target = int(result.targets[0, p])

    def prob(input_ids: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=input_ids).logits[:, -1]
        return torch.softmax(logits.float(), -1)[:, target]

    lig = LayerIntegratedGradients(prob, model.get_input_embeddings())
    per_source = lig.attribute(
        ids, baselines=torch.zeros_like(ids), n_steps=args.n_steps
    ).sum(-1)[0]
    ours = cells.sum((0, 1))[: position + 1]
    rho = spearman(ours, per_source.detach())
    top_lig = per_source.abs().argsort(descending=True)[:5].tolist()
    top_ours = ours.abs().argsort(descending=True)[:5].tolist()
    sources = result.metadata["source_tokens"][0]

    def listed(values: torch.Tensor, order: list) -> str:
        return ", ".join(f"{sources[j]!r}@{j} {float(values[j]):+.3f}" for j in order)

    print("LIG on the embeddings, top |attribution|: " + listed(per_source, top_lig))
    print("IG-Lens sources, top |credit|: " + listed(ours, top_ours))
    print(
        f"Spearman rank agreement over {position + 1} sources: {rho:+.3f}; "
        f"top-5 overlap {len(set(top_lig) & set(top_ours))}/5"
    )


if __name__ == "__main__":
    main()
