r"""
The names the probability flow takes, in one place without heavy imports, so
that the command line builds its choices from them before torch loads.
"""

#: The default number of steps of the path (chosen by the convergence table of
#: ``docs/flow.md``).
DEFAULT_STEPS = 16
#: The most steps a flow takes. The flow adds up exactly at any step count;
#: steps only refine how each step's change is split among edges, and that
#: error falls about fourfold per doubling (1.5e-3 on SmolLM2's largest edge at
#: 32 steps, ``docs/flow.md``), so past 1024 nothing visible changes while each
#: step costs a forward and a backward pass of the whole model.
MAX_STEPS = 1024
#: The default memory budget of one forward's path points and of a step's
#: terms, in bytes (the layer maps' readout chunk, 256 MiB).
DEFAULT_CHUNK_BYTES = 256 * 2**20
#: The estimators (:mod:`captum_iglens.attr.flow.estimator`).
FLOW_METHODS = ("exact", "first_order")
#: What an edge can be scored by: its flow, or its own effect.
SCORES = ("flow", "effect")
#: The baselines that need no counterfactual prompt.
BASELINES = ("pad", "mean")


def check_steps(n_steps: object, name: str) -> None:
    r"""Refuses a step count that is not an int in ``[1, MAX_STEPS]``, naming
    the argument ``name`` (``"n_steps"``, ``"--n-steps"``) in the
    ``ValueError``."""
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {n_steps!r}")
    if n_steps > MAX_STEPS:
        raise ValueError(
            f"{name}: expected at most {MAX_STEPS}, got {n_steps} ({n_steps + 1} "
            "forward and backward passes of the whole model); the flow adds up "
            "exactly at any step count and its edges converge fourfold per "
            f"doubling, so {DEFAULT_STEPS} to 128 steps are the useful range"
        )
