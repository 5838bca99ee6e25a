"""Our p2p collective algorithms give the library's answer (gloo, CPU, world sizes 2..8)."""

import pytest

pytest.importorskip("torch")

from commtax.dist.conformance import spawn_check  # noqa: E402

pytestmark = pytest.mark.torch

SIZES = (1, 3, 1001, 1 << 18)  # tiny, fewer than ranks, not divisible by any world size, 1 MiB of fp32


@pytest.mark.parametrize("world,per_node", [(2, 1), (3, 1), (4, 2), (5, 1), (6, 3), (7, 1), (8, 2)])
def test_algorithms_match_torch_all_reduce(world, per_node, tmp_path):
    # ring, recursive halving-doubling, tree, hierarchical (when whole nodes) × fp32/bf16/int64,
    # plus ring reduce-scatter and all-gather: every rank's result equals dist.all_reduce's
    assert spawn_check(world, SIZES, per_node, str(tmp_path)) == []
