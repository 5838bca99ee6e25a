"""What an op costs: compute (roofline x efficiency), collectives (NCCL tuning model), placement on the topology,
and the priced passes of a step shared across plans."""
