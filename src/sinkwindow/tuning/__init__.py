"""Training-free hybrids: which layers (or KV heads) keep full attention on top of SWA(W, S).

Sits above ``eval`` and ``bench`` (it scores candidates with the evaluation runner and prices them
with ``bench.memory``); nothing in the core, ``eval`` or ``bench`` imports it.

    >>> from sinkwindow.tuning import calibrate, tune
    >>> res = calibrate(model, tok, "swa:256:4", k=6)            # per-layer scores, the top 6 kept full
    >>> res.spec                                                   # 'swa:256:4+full:...'
    >>> best = tune(model, tok, kv_budget_bytes=24 * 2**20, context=4096)

- ``calibrate``: scores every unit by the NLL gain it gives when it alone is full (``nll``), by the
  attention mass it puts outside the window under full attention (``mass``), by both ranks
  (``rank``), by trained gates (``gates``) or by the attention it puts on the needle while the
  answer is written (``retrieval``), on S-NIAH prompts of a calibration seed no evaluation uses,
  and keeps the top K.
- ``tune``: searches W, S, K (and the units) under a KV-memory budget at one context, writes the
  Pareto frontier, and checks the winner on held-out samples of another seed.
- ``frontier``: at each KV budget (a fraction of full attention's), the spec each strategy
  (``STRATEGIES``) reaches, evaluated held out against full attention.

The three are thin front ends over one pipeline, each over a typed config (``CalibrateConfig``,
``TuneConfig``, ``FrontierConfig``; how a run goes, apart from its numbers: ``RunOptions``):

    criteria.py   the criteria, one class each, registered by name in CRITERIA; score_units
    selection.py  top-K and greedy selection of units from their scores (SELECTIONS)
    measure.py    a spec measured through the evaluation runner, in memory or in a run folder
    records.py    every file written, through runs/ (provenance, atomic JSON, the memo's JSONL)
"""

from .._lazy import lazy_package

# Public names by the module that defines them; each loads on first use (see _lazy.py).
__all__ = lazy_package(
    __name__,
    {
        ".calibrate": ["CalibrateConfig", "CalibrationResult", "calibrate", "plot_scores"],
        ".criteria": ["CRITERIA", "Criterion", "ScoringRun", "rank_scores", "score_units"],
        ".selection": ["SELECTIONS", "greedy_select", "select_units"],
        ".frontier": ["STRATEGIES", "FrontierConfig", "FrontierPoint", "frontier"],
        ".mass": ["mass_scores"],
        ".retrieval": ["retrieval_scores"],
        ".measure": ["Measurement", "SampleSet", "measure"],
        ".memo": ["Memo"],
        ".options": ["RunOptions"],
        ".nll": ["answer_nll", "nll_scores"],
        ".prompts": [
            "CAL_SEED",
            "EVAL_SEEDS",
            "CalibrationPrompt",
            "calibration_prompts",
            "check_calibration_seed",
        ],
        ".units": ["UNIT_KINDS", "model_units", "parse_unit", "spec_with_units", "unit_label"],
        ".tune": [
            "HELDOUT_SEED",
            "Candidate",
            "TuneConfig",
            "TuneResult",
            "pareto_front",
            "plan_candidates",
            "plot_frontier",
            "tune",
            "window_grid",
            "write_tune",
        ],
    },
)
