r"""
MIB's circuit-localization faithfulness harness, offline: tasks of prompt
pairs (:mod:`~captum_iglens.studies.circuits.tasks`, the shipped ones in
:mod:`~captum_iglens.studies.circuits.generators`), edge patching over the model's
graph (:mod:`~captum_iglens.studies.circuits.patching`, its circuits by
:mod:`~captum_iglens.graph.circuit`), the edge scorers
(:mod:`~captum_iglens.studies.circuits.scorers`) and the faithfulness curve with CPR
and CMD (:mod:`~captum_iglens.studies.circuits.faithfulness`).
"""
