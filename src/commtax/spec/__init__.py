"""What a job is: typed, frozen, validated specs, and the catalog they name.

Edges are pydantic v2 models (``extra="forbid"``); catalog numbers are converted to SI once, in
:mod:`commtax.spec.hardware`, so nothing downstream sees GB or µs. The modules, bottom up: ``base`` (the frozen
model, precisions), ``files`` (bounded YAML reading), ``hardware``, ``model``, ``frameworks``, ``plan``,
``pipeline_split``, ``job``, ``catalog`` (resolution and loading); ``assumptions`` and ``wire_dtypes`` are read
by the stages below. This module re-exports the public names, so ``from commtax.spec import Job`` reads as the
spec it is.
"""

from commtax.spec.base import BYTES_PER, CATALOG_DIR, CommDtype, Precision, _Spec, allows_bool, replaced  # noqa: F401
from commtax.spec.catalog import (  # noqa: F401
    CATALOG_FILES,
    VARIANT_FIELDS,
    _builtin_catalog,
    build,
    job_unchecked,
    job_with,
    load_catalog,
    load_job,
    plan_variant,
    plan_variant_of,
    plan_variants,
    read_overrides,
    resolve_cluster,
    resolve_entry,
)
from commtax.spec.fabric import Fabric, FabricFlow, FabricJob  # noqa: F401
from commtax.spec.files import (  # noqa: F401
    MAX_YAML_BYTES,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    read_catalog_yaml,
    read_text,
    read_yaml,
)
from commtax.spec.frameworks import (  # noqa: F401
    GENERATION_ALIAS,
    AttentionKernel,
    Framework,
    FrameworkName,
    FrameworkOverlap,
    LegacySoftware,
    Overlap,
    Zero3Gather,
    framework_of,
    frameworks,
    zero_refusal,
)
from commtax.spec.hardware import GPU, Cluster, InterPoolLink, IntraLink, LevelNumbers, Network, Pool, Profile  # noqa: F401
from commtax.spec.job import JOB_CHECKS, Job, JobCheck, eager_attention_archs  # noqa: F401
from commtax.spec.model import Model  # noqa: F401
from commtax.spec.pipeline_split import per_rank, pipeline_split  # noqa: F401
from commtax.spec.plan import Plan, Training  # noqa: F401
from commtax.spec.pools import pool_cluster, pool_shares, stage_pool_indices  # noqa: F401
