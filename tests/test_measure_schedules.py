"""The p2p schedules (torch-free): they compute the sum, take the published number of steps, and cost what
collectives.py says."""

import math

import numpy as np
import pytest

from commtax.costs import collectives as C
from commtax.measure import schedules as S


def simulate(schedule, buffers):
    """Execute a schedule on numpy buffers exactly as run_schedule does (sends read the pre-step state)."""
    for step in schedule:
        new = [b.copy() for b in buffers]
        for t in step:
            if t.reduce:
                new[t.dst][t.lo : t.hi] += buffers[t.src][t.lo : t.hi]
            else:
                new[t.dst][t.lo : t.hi] = buffers[t.src][t.lo : t.hi]
        buffers = new
    return buffers


@pytest.mark.parametrize("algorithm", S.ALGORITHMS)
@pytest.mark.parametrize("n", range(1, 10))
@pytest.mark.parametrize("numel", [1, 5, 1001])
def test_every_rank_ends_with_the_sum(algorithm, n, numel):
    per_node = 3 if algorithm == "hierarchical" and n % 3 == 0 else 1
    rng = np.random.default_rng(n * 1000 + numel)
    bufs = [rng.integers(-1000, 1000, numel) for _ in range(n)]
    out = simulate(S.all_reduce_schedule(algorithm, n, numel, 4, per_node), bufs)
    assert all((b == sum(bufs)).all() for b in out)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_reduce_scatter_then_all_gather_is_all_reduce(n):
    numel = 37
    bufs = [np.arange(numel) * (r + 1) for r in range(n)]
    rs = simulate(S.ring_reduce_scatter(list(range(n)), 0, numel), bufs)
    b = S.chunk_bounds(0, numel, n)
    for r in range(n):  # rank r owns the reduced chunk r
        assert (rs[r][b[r] : b[r + 1]] == sum(bufs)[b[r] : b[r + 1]]).all()
    out = simulate(S.ring_all_gather(list(range(n)), 0, numel), rs)
    assert all((x == sum(bufs)).all() for x in out)


@pytest.mark.parametrize("n,steps", [(2, 2), (5, 8), (8, 14)])
def test_ring_takes_2n_minus_2_steps(n, steps):
    assert len(S.ring_all_reduce(list(range(n)), 0, 1 << 20)) == steps  # 2(n−1), Thakur et al. 2005


@pytest.mark.parametrize("n,steps", [(4, 4), (8, 6), (6, 6)])
def test_recursive_halving_doubling_steps(n, steps):
    # 2·log2(p) steps, +2 (fold in, hand back) when n is not a power of two: 6 = 2·2 + 2
    assert len(S.recursive_halving_doubling_all_reduce(list(range(n)), 0, 1 << 20)) == steps


def test_pipelined_tree_steps():
    n, k = 7, 4  # full binary tree of 7: height H = 2, depth D = 2
    assert len(S.binary_tree_all_reduce(list(range(n)), 0, 1 << 20, k)) == k + 2 + 2 - 1


def one_level(per_node, intra_bw, inter_bw, alpha):
    return S.TwoLevelLinks(per_node, intra_bw, alpha, inter_bw, alpha)


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter"])
def test_ring_schedule_cost_equals_collectives_ring(op):
    # one description, two uses: the schedule priced step by step = collectives.ring_time
    n, S_bytes, B, a = 4, 4 * 2**20, 37.5e6, 100e-6
    links = one_level(1, 1e12, B, a)
    ours = S.predict_time_s(op, "ring", n, S_bytes, links)
    inter = C.Level("inter", B, a)
    theirs = C.ring_time(op, S_bytes, C.Placement(n, 1, C.Level("intra", 1e12, a), inter))[0]
    assert ours == pytest.approx(theirs, rel=1e-9)
    if op == "all_reduce":
        assert ours == pytest.approx(2 * (n - 1) * a + 2 * (n - 1) / n * S_bytes / B)  # Thakur et al. 2005


def test_hierarchical_schedule_cost_equals_collectives_hierarchical():
    # 2 nodes × 4 ranks; NIC B per node shared by its 4 ranks (per-GPU share B/4 in collectives' terms)
    k, N, S_bytes, Bi, Bo, a = 4, 2, 8 * 2**20, 5e9, 37.5e6, 50e-6
    links = S.TwoLevelLinks(k, Bi, a, Bo, a)
    ours = S.predict_time_s("all_reduce", "hierarchical", k * N, S_bytes, links)
    p = C.Placement(k * N, k, C.Level("intra", Bi, a), C.Level("inter", Bo / k, a))
    assert ours == pytest.approx(C.hierarchical_time("all_reduce", S_bytes, p)[0], rel=1e-9)
    ring = S.predict_time_s("all_reduce", "ring", k * N, S_bytes, links)
    assert ring == pytest.approx(C.ring_time("all_reduce", S_bytes, p)[0], rel=1e-6)
    # the NIC carries 2(n−1)/n·S for the flat ring but 2(N−1)/N·S for hierarchical: 1.75 vs 1.0
    assert ring / ours == pytest.approx(1.75, rel=0.05)


def test_recursive_doubling_cost_power_of_two_single_level():
    n, S_bytes, B, a = 8, 2**20, 1e9, 10e-6
    ours = S.predict_time_s("all_reduce", "recursive_doubling", n, S_bytes, one_level(n, B, B, a))
    # 2·log2(n)·α + 2·(n−1)/n·S/B (Rabenseifner; Thakur et al. 2005 §4.4)
    assert ours == pytest.approx(2 * math.log2(n) * a + 2 * (n - 1) / n * S_bytes / B)
