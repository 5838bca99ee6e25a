"""Which matmuls PyTorch's activation checkpointing re-runs in backward (run on CPU: python checkpoint_early_stop.py).

A pre-norm MLP block x + fc2(gelu(fc1(x))) under torch.utils.checkpoint: backward without recompute runs 4 matmuls
(dgrad and wgrad of fc1 and fc2); a full recompute would add both forward matmuls (6). The non-reentrant
implementation stops recomputing as soon as every tensor backward needs is back (torch.utils.checkpoint
``set_checkpoint_early_stop``, on by default): fc2 saves its inputs before it multiplies, so its matmul, the block's
last, is never re-run (5). The reentrant one (Megatron's and DeepSpeed's checkpointing are reentrant) re-runs all (6).
"""

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

MATMULS = {"mm", "addmm", "bmm", "matmul", "linear"}


class CountMatmuls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func.overloadpacket.__name__ in MATMULS
        return func(*args, **(kwargs or {}))


class Block(nn.Module):
    def __init__(self, h: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(h, 4 * h, bias=False)
        self.fc2 = nn.Linear(4 * h, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(nn.functional.gelu(self.fc1(x)))


def backward_matmuls(use_reentrant: bool) -> int:
    block, x = Block(), torch.randn(8, 64, requires_grad=True)
    y = checkpoint(block, x, use_reentrant=use_reentrant)
    with CountMatmuls() as count:
        y.sum().backward()
    return count.n


if __name__ == "__main__":
    print(f"torch {torch.__version__}: matmuls in backward (4 without recompute, 6 with a full one)")
    for reentrant in (False, True):
        print(f"  use_reentrant={reentrant}: {backward_matmuls(reentrant)}")
