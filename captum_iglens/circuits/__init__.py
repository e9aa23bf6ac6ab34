r"""
MIB's circuit-localization faithfulness harness, offline: tasks of prompt
pairs (:mod:`~captum_iglens.circuits.tasks`, the shipped ones in
:mod:`~captum_iglens.circuits.generators`), the edge graph of a model and
edge patching (:mod:`~captum_iglens.circuits.graph`,
:mod:`~captum_iglens.circuits.patching`), the edge scorers
(:mod:`~captum_iglens.circuits.scorers`) and the faithfulness curve with CPR
and CMD (:mod:`~captum_iglens.circuits.faithfulness`).
"""
