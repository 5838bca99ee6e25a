"""A job's plan search as ``commtax search`` runs it: the space from the plan flags, the MoE search when an MoE flag
is given, the pool search on a cluster of GPU pools, and each best plan's $ per billion tokens.

The CLI reads its options, calls :func:`search_job` and prints what comes back (``report.planning``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from commtax.decide.cost import usd_per_B_tokens
from commtax.errors import SpecError
from commtax.spec import Job

PriceMode = Literal["owned", "rented"]
Update = Callable[[int, int], None]
ProgressBar = Callable[[str], AbstractContextManager[Update]]  # label -> a context yielding update(done, total)

MAX_VERIFY = 100  # search --verify: plans simulated (each a whole step's event graph)
MOE_FIELDS = ("ep", "etp", "moe_dispatcher", "moe_a2a_overlap")


@contextmanager
def no_bar(label: str) -> Iterator[Update]:
    """The progress bar of a caller that shows none."""
    yield lambda done, total: None


@dataclass(frozen=True)
class Price:
    """What the cluster costs per second, or why it has no price (an unpriced GPU: no $ column)."""

    mode: PriceMode
    usd_per_s: float | None
    error: str | None = None


def cluster_price(job: Job, prices: Path | None, mode: PriceMode, required: bool) -> Price:
    """The job's cluster in $/s (owned or rented); an unpriced GPU raises only when the price is ``required``
    (a --prices file was given, or the plans are ranked by $)."""
    from commtax.decide.cost import job_cluster_cost, load_prices

    try:
        return Price(mode, job_cluster_cost(job, load_prices(prices)).usd_per_s(mode))
    except SpecError as e:
        if required:
            raise
        return Price(mode, None, str(e))


@dataclass(frozen=True)
class JobSearch:
    """A plan search (``decide.search.SearchResult``) with the $ of its best plans."""

    result: Any  # SearchResult
    price: Price

    def to_dict(self) -> dict[str, Any]:
        data = self.result.to_dict()
        if self.price.usd_per_s is not None:
            usd_per_s = self.price.usd_per_s
            for entry, (_, b) in zip(data["top"], self.result.top):
                entry["usd_per_B_tokens"] = usd_per_B_tokens(usd_per_s, b.tokens_per_s)
                entry["tokens_per_dollar"] = b.tokens_per_s / usd_per_s
            data["price_mode"] = self.price.mode
        return data


@dataclass(frozen=True)
class PoolJobSearch:
    """The pool search (``decide.pool_search.PoolSearchResult``) with the $ of its best plans."""

    result: Any  # PoolSearchResult
    price: Price

    def to_dict(self) -> dict[str, Any]:
        data = self.result.to_dict()
        usd_per_s = self.price.usd_per_s
        for entry, (_, b) in zip(data["top"], self.result.top):
            entry["usd_per_B_tokens"] = usd_per_B_tokens(usd_per_s, b.tokens_per_s) if usd_per_s else None
        return data


def refuse_plan_flags_on_pools(
    plan: dict[str, str | None], moe: dict[str, str | None], fix: str | None, search_flags: tuple[str, ...] = ()
) -> None:
    """The pool search spans its own space: a flag it would not read is named, not ignored."""
    given = [k for k, v in {**plan, **moe}.items() if v is not None] + (["fix"] if fix else [])
    if given:
        name = f"--{given[0].replace('_', '-')}"
        raise SpecError(
            f"{name}: a cluster of GPU pools is searched over its pool assignments and splits "
            "(decide/pool_search.py), which take no plan flags; drop it or set the field in the job file"
        )
    if search_flags:  # ranks by step time, in one process, and shows its own plans (not the grid's CSV rows)
        raise SpecError(
            f"--{search_flags[0]}: the pool search (a cluster of GPU pools) ranks its plans by step time and "
            "simulates none; it takes no --rank, --verify, --csv or --workers; drop it"
        )


def fixed_fields(fix: str | None) -> list[str]:
    """``--fix tp,zero``: the fields pinned to the job's plan."""
    return [f.strip() for f in fix.split(",") if f.strip()] if fix else []


def search_job(
    job: Job,
    plan: dict[str, str | None],
    moe: dict[str, str | None] | None = None,
    fix: str | None = None,
    *,
    rank_by: str = "step",
    top: int = 5,
    verify: int = 0,
    rent: bool = False,
    workers: int | None = None,
    prices: Path | None = None,
    progress_bar: ProgressBar = no_bar,
    writes_csv: bool = False,
) -> JobSearch | PoolJobSearch:
    """Every valid plan of ``job`` within the flags' space (``plan``: field -> text as ``Space.parse`` reads it;
    ``moe``: the MoE fields, any given means the MoE search), ranked, the best ``top`` with their $; ``verify`` of
    them simulated. On a cluster of GPU pools, the pool search (which takes no plan flags)."""
    moe = moe or dict.fromkeys(MOE_FIELDS)
    mode: PriceMode = "rented" if rent else "owned"
    if job.cluster.pools:  # several GPU pools: assignments, layer splits and batch shares (decide/pool_search.py)
        unread = {"rank": rank_by != "step", "verify": verify > 0, "csv": writes_csv, "workers": workers is not None}
        refuse_plan_flags_on_pools(plan, moe, fix, tuple(k for k, given in unread.items() if given))
        return _search_pools(job, top, cluster_price(job, prices, mode, prices is not None), progress_bar)
    from commtax.decide.search import Space, search, search_moe

    space = Space.parse(plan, fixed_fields(fix))
    price = cluster_price(job, prices, mode, prices is not None or rank_by != "step")
    if verify > MAX_VERIFY:
        raise SpecError(
            f"--verify: {verify:,} plans to simulate; the limit is {MAX_VERIFY} (each is a full simulation)"
        )
    with progress_bar("searching plans") as update:
        if any(v is not None for v in moe.values()):
            res = search_moe(job, moe, space, rank_by=rank_by, top=top, workers=workers, progress=update, verify=verify)
        else:
            res = search(job, space, rank_by=rank_by, top=top, workers=workers, progress=update, verify=verify)
    return JobSearch(res, price)


def _search_pools(job: Job, top: int, price: Price, progress_bar: ProgressBar) -> PoolJobSearch:
    from commtax.decide.pool_search import pool_search

    with progress_bar("searching pool plans") as update:
        return PoolJobSearch(pool_search(job, top=top, progress=update), price)
