"""Real communication on torch.distributed: collective algorithms, bench, calibrate, emulated cluster.

Importing this package does not import torch; only ``algorithms``, ``bench`` and the
worker entry points do, when they run.
"""
