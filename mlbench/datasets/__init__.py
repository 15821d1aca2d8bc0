"""`mlbench data`: the datasets users hold on disk, turned into what the workloads read.

One module per dataset (`c4`, `imagenet`, ...) plans the shards of its output and
writes one shard; `shards` runs the plan (parallel, atomic, resumable, with a
progress bar) and keeps the manifest; `check` verifies a prepared folder (with the
reading workload's own checks, `InputSpec.verify`). `records` (TFRecords) and `indexed`
(Megatron's .bin/.idx) are the formats both sides share: the workloads read them and
write their mini data with them. Imports flow `cli -> datasets -> base`; a workload is
reached through the registry, never imported.
"""
