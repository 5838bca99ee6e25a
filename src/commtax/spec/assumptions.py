"""Modelling assumptions as data: one typed, frozen ``Assumptions`` record loaded from ``catalog/assumptions.yaml``.

Every field carries its value, a ``source`` and ``fitted_on`` (the validation row ids it was chosen on; empty
when it comes from component data: kernel benchmarks, vendor documents). A calibration profile may override
any value (``assumptions:`` section of a ``commtax calibrate`` profile); ``fitted()`` lists what was fitted.
"""

# no `from __future__ import annotations`: pydantic would compile and evaluate each field's annotation string

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from commtax.errors import SpecError
from commtax.spec.base import plain_attribute_reads

ASSUMPTIONS_FILE = Path(__file__).parents[1] / "catalog" / "assumptions.yaml"


@plain_attribute_reads  # read per plan by the compute and memory model
class Assumption(BaseModel):
    """One assumed number with its origin."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    value: float
    source: str = Field(min_length=1)
    fitted_on: tuple[str, ...] = ()
    prior: float | None = None  # the value before fitting: what a fit without its rows falls back to


@plain_attribute_reads
class Assumptions(BaseModel):
    """The compute and memory model's assumed constants (units in the names where not SI)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    gemm_tile: Assumption  # thread-block tile edge, elements
    gemm_k_half: Assumption  # k (elements) where prologue/epilogue cost equals the main loop
    gemm_k_ref: Assumption  # k at which a GEMM reaches the catalog efficiency
    fp8_k_half_factor: Assumption  # fp8 main loop is this much faster per k
    memory_efficiency: Assumption  # achieved / peak HBM bandwidth of elementwise kernels
    kernel_gap_s: Assumption  # GPU-side cost between dependent kernels
    cpu_op_s: Assumption  # host time to issue one eager op
    cuda_context_GiB: Assumption
    nccl_group_GiB: Assumption  # NCCL buffers per communicator
    allocator_fragmentation: Assumption  # share of activation bytes the caching allocator holds on top
    legacy_before_year: Assumption  # fallback year rule when a run's framework is unknown
    fp8_cast_bytes_delayed: Assumption  # HBM bytes per element to prepare an fp8 operand (TE delayed scaling)
    fp8_cast_bytes_dynamic: Assumption  # same, dynamic tensorwise scaling (torchao float8)
    fp8_cast_bytes_current: Assumption  # same, TE per-tensor current scaling (an amax pass, then cast-transpose)
    fp8_cast_bytes_mxfp8: Assumption  # same, TE MXFP8 block scaling (both layouts and their E8M0 scales, one pass)
    hopper_clock_fraction: Assumption  # sustained / datasheet-peak SM clock of Hopper GPUs under dense load
    nccl_ctas_nvlink: Assumption  # SMs an NCCL collective holds on NVLink nodes (one CTA per channel)
    nccl_ctas_pcie: Assumption  # same on PCIe-only nodes
    userbuffers_sms: Assumption  # SMs a TE userbuffers comm-GEMM overlap holds, mean per collective
    comm_hbm_bytes_per_wire_byte: Assumption  # HBM traffic of a collective per byte sent

    def v(self, name: str) -> float:
        """The value of one field."""
        return getattr(self, name).value

    def fitted(self) -> dict[str, tuple[str, ...]]:
        """Fields chosen by looking at validation rows, with those rows."""
        return {k: a.fitted_on for k, a in self if a.fitted_on}

    def with_values(self, overrides: dict[str, float], source: str = "calibration profile") -> "Assumptions":
        """A copy with some values replaced (a calibration profile's ``assumptions:`` section)."""
        unknown = set(overrides) - set(type(self).model_fields)
        if unknown:
            raise SpecError(
                f"assumptions: unknown field(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(type(self).model_fields)}"
            )
        changed = {k: Assumption(value=float(v), source=source) for k, v in overrides.items()}
        return self.model_copy(update=changed)


def load_assumptions(path: Path | str = ASSUMPTIONS_FILE) -> Assumptions:
    from commtax.spec.files import read_catalog_yaml, read_yaml

    data = read_catalog_yaml(ASSUMPTIONS_FILE) if Path(path) == ASSUMPTIONS_FILE else read_yaml(Path(path))
    try:
        return Assumptions.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        raise SpecError(f"{path}: {'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None


_OVERRIDE: list[Assumptions] = []


@lru_cache(maxsize=1)
def _catalog_assumptions() -> Assumptions:
    return load_assumptions()


def default_assumptions() -> Assumptions:
    """The catalog's assumptions (or, inside ``using_assumptions``, the ones given there)."""
    return _OVERRIDE[-1] if _OVERRIDE else _catalog_assumptions()


@contextmanager
def using_assumptions(a: Assumptions) -> Iterator[None]:
    """Predict with other assumptions for a while (leave-one-source-out refits in ``validate --loso``)."""
    _OVERRIDE.append(a)
    try:
        yield
    finally:
        _OVERRIDE.pop()


def without_rows(a: Assumptions, rows: set[str]) -> tuple[Assumptions, list[str], list[str]]:
    """The assumptions as fitted without ``rows``: (assumptions, refitted fields, fields with no refit).

    A field fitted only on those rows has no data left: it falls back to its ``prior``. A field fitted partly on
    other rows would need its fitting procedure re-run; none is recorded, so it is kept and named.
    """
    changes: dict[str, Assumption] = {}
    refit, kept = [], []
    for name, field in a:
        hit = set(field.fitted_on) & rows
        if not hit:
            continue
        if set(field.fitted_on) <= rows and field.prior is not None:
            changes[name] = field.model_copy(update={"value": field.prior, "fitted_on": ()})
            refit.append(name)
        else:
            kept.append(name)
    return a.model_copy(update=changes), refit, kept


def assumptions_for(profile: Any) -> Assumptions:
    """The built-in assumptions, with a calibration profile's ``assumptions:`` overrides when it has any."""
    base = default_assumptions()
    overrides = getattr(profile, "assumptions", None) if profile is not None else None
    return base.with_values(dict(overrides)) if overrides else base
