"""Our p2p collective algorithms give the library's answer (gloo, CPU, world sizes 2..8)."""

import pytest

pytest.importorskip("torch")

from commtax.measure.conformance import spawn_check  # noqa: E402

pytestmark = pytest.mark.torch

SMALL = (1, 3, 1001)  # one element, fewer elements than ranks, divisible by no world size here
LARGE = 1 << 18 | 5  # 1 MiB of fp32 and then some: uneven chunks on a real-sized buffer


@pytest.mark.parametrize(
    "world,per_node,large",
    [
        (2, 1, True),
        (3, 1, False),
        (4, 2, False),
        (5, 1, True),
        (6, 3, False),
        (7, 1, False),
        (8, 2, True),
    ],
)
def test_algorithms_match_torch_all_reduce(world, per_node, large, tmp_path):
    # ring, recursive halving-doubling, tree, hierarchical (when whole nodes) × fp32/bf16/int64,
    # plus ring reduce-scatter and all-gather: every rank's result equals dist.all_reduce's
    sizes = SMALL + ((LARGE,) if large else ())
    assert spawn_check(world, sizes, per_node, str(tmp_path)) == []
