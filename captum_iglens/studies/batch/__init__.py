r"""
IG-Lens maps of a prompt set: padded batches
(:mod:`~captum_iglens.studies.batch.padded`), incremental JSON Lines output
(:mod:`~captum_iglens.studies.batch.records`), resumption after an interruption
(:mod:`~captum_iglens.studies.batch.resume`) under a lock
(:mod:`~captum_iglens.studies.batch.lock`), and splitting across processes with
``torch.distributed`` (:mod:`~captum_iglens.studies.batch.run`, the process
group in :mod:`~captum_iglens.studies.distributed`). The graphs of a pair
file (:mod:`~captum_iglens.studies.batch.graphs`) run on the same lock, record
and processes.
"""

from captum_iglens.studies.distributed import init_distributed
from captum_iglens.studies.batch.graphs import GRAPHS, graph_pairs
from captum_iglens.studies.batch.lock import LOCK, BatchLock
from captum_iglens.studies.batch.page import write_html
from captum_iglens.studies.batch.records import (
    GIVEN,
    RESULTS,
    read_results,
    to_result,
)
from captum_iglens.studies.batch.resume import RUN, check_model, check_resume
from captum_iglens.studies.batch.run import run_batch

__all__ = [
    "GIVEN",
    "GRAPHS",
    "LOCK",
    "RESULTS",
    "RUN",
    "BatchLock",
    "check_model",
    "check_resume",
    "graph_pairs",
    "init_distributed",
    "read_results",
    "run_batch",
    "to_result",
    "write_html",
]
