"""How faithful and how plausible attributions are, measured the way the papers measure them.

* :class:`Protocol` and :data:`PRESETS` (``normxlogit``, ``mask-lrp``, ``ferret``): every choice
  of an evaluation as a named field (:mod:`heedful.evaluate.protocol`);
* :func:`evaluate`: metrics of a list of explanations (:mod:`heedful.evaluate.evaluation`);
* :data:`METRICS`: AOPC / comprehensiveness, sufficiency, log-odds, accuracy (drop), Pearson
  (drop), deletion / insertion areas, tau-LOO, and the plausibility metrics dot product, average
  precision, AUPRC, token F1, IOU (:mod:`heedful.evaluate.metrics`);
* :func:`generation_faithfulness`: comprehensiveness and sufficiency of generation
  explanations for the continuation's log-probability (:mod:`heedful.evaluate.generation`);
* context attribution: top-1 / top-3 source accuracy, token precision@k against the answer,
  source comprehensiveness and LDS, with bootstrap intervals (:mod:`heedful.evaluate.context`);
* :func:`aopc_ceiling`: the exact best AOPC (or sufficiency) any ranking can score on a short
  text, and the ordering that scores it (:mod:`heedful.evaluate.ceiling`);
* :class:`ResultsStore`: the SQLite store ``heedful bench`` resumes from
  (:mod:`heedful.evaluate.store`); :func:`run_bench` runs methods x examples x metrics
  (:mod:`heedful.evaluate.bench`);
* :func:`~heedful.evaluate.roar.roar`: ROAR and KAR (Hooker et al. 2019) -- the accuracy of a classifier retrained
  without (or with only) each method's top-k % tokens, resumable from a results store
  (:mod:`heedful.evaluate.roar`);
* :func:`export_store`: a results store as one Parquet / CSV table with a run manifest
  (:mod:`heedful.evaluate.export`);
* :func:`from_records`, :func:`from_json`, :func:`from_parquet`, :func:`from_captum`,
  :func:`from_inseq`: explanations computed elsewhere, aligned to a model's tokens so that
  every metric scores them (:mod:`heedful.evaluate.imports`; ``heedful bench import`` stores
  and scores them beside heedful's methods, :mod:`heedful.evaluate.bench_import`).
"""

from heedful.evaluate.alignment import AlignmentError
from heedful.evaluate.ceiling import Ceiling, aopc_ceiling
from heedful.evaluate.evaluation import MetricResult, ModelInput, evaluate, model_inputs
from heedful.evaluate.export import export_store
from heedful.evaluate.generation import GenerationFaithfulness, generation_faithfulness
from heedful.evaluate.imports import (
    from_captum,
    from_inseq,
    from_json,
    from_parquet,
    from_records,
)
from heedful.evaluate.intervals import bootstrap_mean
from heedful.evaluate.metrics import METRICS, Metric, PerExample, Summary, get_metric, metric_names
from heedful.evaluate.protocol import PRESETS, Protocol, get_protocol
from heedful.evaluate.store import ResultsStore, RunKey

__all__ = [
    "AlignmentError",
    "Ceiling",
    "GenerationFaithfulness",
    "METRICS",
    "PRESETS",
    "Metric",
    "MetricResult",
    "ModelInput",
    "PerExample",
    "Protocol",
    "ResultsStore",
    "RunKey",
    "Summary",
    "aopc_ceiling",
    "bootstrap_mean",
    "evaluate",
    "export_store",
    "from_captum",
    "from_inseq",
    "from_json",
    "from_parquet",
    "from_records",
    "generation_faithfulness",
    "get_metric",
    "get_protocol",
    "metric_names",
    "model_inputs",
]
