r"""
The names the probability flow takes, in one place without heavy imports, so
that the command line builds its choices from them before torch loads.
"""

#: The default number of steps of the path (chosen by the convergence table of
#: ``docs/flow.md``).
DEFAULT_STEPS = 16
#: The default memory budget of one forward's path points and of a step's
#: terms, in bytes (the layer maps' readout chunk, 256 MiB).
DEFAULT_CHUNK_BYTES = 256 * 2**20
#: The estimators (:mod:`captum_iglens.attr.flow.estimator`).
FLOW_METHODS = ("exact", "first_order")
#: The baselines that need no counterfactual prompt.
BASELINES = ("pad", "mean")
