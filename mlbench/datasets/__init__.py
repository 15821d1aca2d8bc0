"""`mlbench data`: the datasets users hold on disk, turned into what the workloads read.

One module per dataset (`c4`, `imagenet`, ...) plans the shards of its output and
writes one shard; `shards` runs the plan (parallel, atomic, resumable, with a
progress bar) and keeps the manifest; `check` verifies a prepared folder. The
workloads keep their readers; this wing owns the writers. Imports flow
`cli -> datasets -> base` (and the workloads' format modules, for the formats).
"""
