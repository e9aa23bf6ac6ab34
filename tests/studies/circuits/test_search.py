"""The circuit search: its gradient against finite differences, a planted
circuit it recovers where the warm start's ranking does not, its circuits'
sizes and pruning, and that the scored pairs never reach it."""

import itertools

import pytest
import torch

from captum_iglens.graph.circuit import legal_edges, prune, top_edges
from captum_iglens.graph.model_graph import model_graph
from captum_iglens.studies.circuits.batches import make_batches
from captum_iglens.studies.circuits.context import ScoringContext
from captum_iglens.studies.circuits.faithfulness import PERCENTS, circuits, ranking
from captum_iglens.studies.circuits.objective import PatchedObjective
from captum_iglens.studies.circuits.patching import CircuitModel
from captum_iglens.studies.circuits.scorers import eap
from captum_iglens.studies.circuits.search import search_rankings
from captum_iglens.studies.circuits.study import run_circuits
from captum_iglens.studies.circuits.tasks import Encoded, Pair
from tests.tiny_models import tiny_model


class PlantedObjective:
    r"""
    A scalar network on a 2-layer, 2-head graph with hand-set weights: each
    sender writes one number, each receiver reads ``Σ_u W_uw (z'_u + c_uw
    (z_u − z'_u))`` (edge patching, as the model's), the clean input writes 1
    and the counterfactual one 0, and ``m`` is what ``logits`` reads. The
    heads of layer 0 copy the input; ``a1.h0`` saturates,
    ``1 − exp(−2x)``, reading both (an OR of two paths, ``a0.h1``'s weaker);
    ``logits`` reads ``a1.h0``, the input directly (0.5), and each head of
    layer 0 a little (0.2, 0.15).

    At the full model the saturated edges into ``a1.h0`` look unimportant
    (their gradient, EAP's score, is small), so the ranking's best four
    edges leave ``a1.h0`` without an input; the best circuit of four edges,
    by brute force, is :data:`PLANTED`.
    """

    def __init__(self) -> None:
        self.graph = model_graph(2, 2, qkv=False)
        g = self.graph
        self.W = torch.zeros(g.legal.shape, dtype=torch.float64)
        for edge, weight in WEIGHTS.items():
            sender, receiver = edge.split("->")
            self.W[g.senders.index(sender), g.receivers.index(receiver)] = weight
        self.full = float(self._m(legal_edges(g).double()))

    def _m(self, c: torch.Tensor) -> torch.Tensor:
        g = self.graph
        z = [torch.ones((), dtype=torch.float64)]  # the input's write (z' = 0)
        for node in range(1, len(g.senders)):
            reads = [r for r in range(len(g.receivers)) if g.receiver_node[r] == node]
            x = sum(self.W[u, reads[0]] * c[u, reads[0]] * z[u] for u in range(node))
            z.append(1 - torch.exp(-2 * x) if g.senders[node] == "a1.h0" else x)
        logits = len(g.receivers) - 1
        return sum(self.W[u, logits] * c[u, logits] * z[u] for u in range(len(z)))

    def faithfulness(self, keeps):
        return [float(self._m(k.double())) / self.full for k in keeps]

    def gradient(self, keep):
        c = keep.double().requires_grad_(True)
        (grad,) = torch.autograd.grad(self._m(c), c)
        return grad / self.full


WEIGHTS = {
    "input->a0.h0": 1.0,
    "input->a0.h1": 1.0,
    "a0.h0->a1.h0": 1.0,
    "a0.h1->a1.h0": 0.8,
    "a1.h0->logits": 1.0,
    "input->logits": 0.5,
    "a0.h0->logits": 0.2,
    "a0.h1->logits": 0.15,
}
PLANTED = {"input->a0.h0", "a0.h0->a1.h0", "a1.h0->logits", "input->logits"}


def _names(graph, keep):
    return {
        f"{graph.senders[s]}->{graph.receivers[r]}" for s, r in keep.nonzero().tolist()
    }


def _keep(graph, names):
    keep = torch.zeros(graph.legal.shape, dtype=torch.bool)
    for name in names:
        sender, receiver = name.split("->")
        keep[graph.senders.index(sender), graph.receivers.index(receiver)] = True
    return keep


def test_the_search_recovers_a_planted_circuit_that_the_ranking_misses():
    objective = PlantedObjective()
    graph = objective.graph
    best = max(  # brute force over the edges that do anything
        itertools.combinations(WEIGHTS, 4),
        key=lambda edges: objective.faithfulness([_keep(graph, edges)])[0],
    )
    assert set(best) == PLANTED
    (planted_f,) = objective.faithfulness([_keep(graph, PLANTED)])
    warm = objective.gradient(legal_edges(graph))  # EAP: the gradient at the model
    size = 16.0  # int(0.16 * 26) = 4 edges
    for absolute in (False, True):
        ranked = top_edges(graph, warm, 4, absolute)
        assert _names(graph, ranked) != PLANTED  # the ranking alone misses it
        (ranked_f,) = objective.faithfulness([ranked])
        assert ranked_f < planted_f - 0.3
    searched = search_rankings(graph, objective, warm, percents=(size, 100.0))
    assert searched.shape == (2, *graph.legal.shape)
    for absolute in (False, True):  # CPR's ranking, then CMD's
        found = top_edges(graph, ranking(searched, absolute), 4, absolute)
        assert _names(graph, found) == PLANTED


def _pairs(n, seed, length=5):
    """``n`` random pairs of the tiny model's vocabulary, the answer its top
    token on the clean prompt and the foil its last among 4-9."""
    model = tiny_model("llama")
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        clean = torch.randint(10, 128, (length,), generator=generator)
        other = clean.clone()
        other[1:3] = torch.randint(10, 128, (2,), generator=generator)
        with torch.no_grad():
            logits = model(input_ids=clean[None]).logits[0, -1]
        top = [int(t) for t in logits.argsort(descending=True) if 3 < int(t) < 10]
        pair = Pair(str(clean.tolist()), str(other.tolist()), "a", "b", line=i + 1)
        out.append(
            Encoded(pair, tuple(clean.tolist()), tuple(other.tolist()), top[0], top[-1])
        )
    return out


@pytest.fixture(scope="module")
def tiny():
    return CircuitModel(tiny_model("llama"))


def test_the_gradient_is_the_patched_runs_by_finite_differences(tiny):
    """∂f/∂c at a circuit, every kind of edge: kept, cut, and into a receiver
    the circuit cuts off from every sender (a leaf of its own)."""
    objective = PatchedObjective(tiny, make_batches(_pairs(3, 0), 8), "logit_diff")
    graph = tiny.graph
    generator = torch.Generator().manual_seed(1)
    keep = legal_edges(graph) & (
        torch.rand(graph.legal.shape, generator=generator) < 0.5
    )
    alone = graph.receivers.index("a1.h2<k>")
    keep[:, alone] = False
    gradient = objective.gradient(keep)
    edges = (
        keep.nonzero()[:4].tolist()
        + (legal_edges(graph) & ~keep).nonzero()[:4].tolist()
    )
    edges.append([graph.senders.index("a0.h1"), alone])
    eps = 1e-2
    for s, r in edges:
        up, down = keep.float(), keep.float()
        up[s, r] += eps
        down[s, r] -= eps
        high, low = objective.faithfulness([up, down])
        expected = (high - low) / (2 * eps)
        assert gradient[s, r].item() == pytest.approx(expected, rel=2e-2, abs=1e-4)
    assert gradient[graph.senders.index("a0.h1"), alone].abs() > 1e-4


def test_searched_circuits_keep_mibs_sizes_and_pruning_and_never_see_the_scored(
    tiny,
):
    """End to end on the tiny model: the search's circuits at each size are
    pruned, have at most int(k/100 E) edges, are nested, and do no worse on
    the training pairs than the warm start's; other scored pairs change no
    method's scores (every method is scored on the training pairs)."""
    train, test = _pairs(6, 2), _pairs(4, 3)
    other_test = _pairs(4, 4)
    methods = ["eap", "search:eap"]
    records = run_circuits(tiny, None, test, methods, train=train, n_boot=10)
    again = run_circuits(tiny, None, other_test, methods, train=train, n_boot=10)
    searched = records[1]["scores"]
    assert searched.shape == (2, *tiny.graph.legal.shape)
    torch.testing.assert_close(
        searched, again[1]["scores"], rtol=0, atol=0, equal_nan=True
    )  # the scored pairs unseen
    assert torch.equal(records[0]["scores"], again[0]["scores"])
    graph = tiny.graph
    objective = PatchedObjective(tiny, make_batches(train, 8), "logit_diff")
    warm = objective.gradient(legal_edges(graph))  # EAP on the training pairs
    context = ScoringContext(tiny, None, make_batches(train, 8), 6, "logit_diff")
    scale = objective.full - objective.empty
    # EAP at the model, to the search's float32 products (whose rounding
    # depends on the thread count)
    torch.testing.assert_close(warm * scale, eap(context), rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(records[0]["scores"], eap(context), rtol=0, atol=0)
    improved = 0
    for absolute in (False, True):
        found = circuits(graph, searched, absolute)
        start = circuits(graph, warm, absolute)
        for k, (keep, pct) in enumerate(zip(found, PERCENTS)):
            assert torch.equal(prune(graph, keep), keep)
            assert int(keep.sum()) <= int(pct / 100 * graph.n_edges)
            assert k == 0 or bool((found[k - 1] <= keep).all())  # nested
        f_found = objective.faithfulness(found)
        f_start = objective.faithfulness(start)
        for new, old in zip(f_found, f_start):
            if absolute:
                assert abs(1 - new) <= abs(1 - old) + 1e-6
            else:
                assert new >= old - 1e-6
            improved += abs(new - old) > 1e-3
    assert improved  # the search moved something


def test_a_search_without_training_pairs_or_with_shared_prompts_is_refused(tiny):
    pairs = _pairs(3, 5)
    with pytest.raises(ValueError, match="search:eap searches on training pairs"):
        run_circuits(tiny, None, pairs, ["search:eap"], n_boot=5)
    with pytest.raises(ValueError, match="training pair 1 shares the prompt"):
        run_circuits(tiny, None, pairs[:2], ["eap"], train=pairs[2:] + pairs[:1])
