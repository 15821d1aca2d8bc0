"""Building blocks shared by the workloads (not a workload itself)."""
