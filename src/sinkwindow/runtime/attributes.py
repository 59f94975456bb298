"""Names of the attributes sinkwindow sets on a user's model, in one place.

The runtime (``runtime.patching``), the linear baselines (``linear/``) and the method switch (``method``) each
leave a marker on the model object; every module reads them through these constants, so a rename
cannot leave one reader behind. This module imports nothing, so any module may import it.
"""

__all__ = [
    "BASE_CLASS_ATTR",
    "CACHE_FACTORY_ATTR",
    "HYBRID_ATTR",
    "MODEL_NAME_ATTR",
    "PLAN_ATTR",
    "RETROFIT_ATTR",
]

# ``patching.apply``: the ``plan.AttentionPlan`` the model runs (read it with ``plan.plan_of``).
PLAN_ATTR = "_sinkwindow_plan"
# ``patching.apply``: a hybrid spec's installed full-head wrappers (``full_units.install``), told the cache each step.
HYBRID_ATTR = "_sinkwindow_hybrid"
# ``linear.convert``: the conversion to a linear-attention baseline (``linear.attention.Retrofit``).
RETROFIT_ATTR = "_sinkwindow_linear"
# ``linear.convert``: builds the converted model's own cache, which ``make_cache`` returns.
CACHE_FACTORY_ATTR = "_sinkwindow_cache_factory"
# ``models.loading.load``: the name the model was loaded by, so packaged models find their shipped adapters.
MODEL_NAME_ATTR = "_sinkwindow_model_name"
# ``patching.apply``: on the class it swaps in (a subclass of the model's own), that own class.
BASE_CLASS_ATTR = "_sinkwindow_base"
