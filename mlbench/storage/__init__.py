"""Where mlbench keeps what it writes, on a local disk, a shared mount or a bucket.

`paths` turns names into paths (every path may be a `gs://` bucket, an `etils.epath.Path`;
names checked to stay inside their root; the default cache folder); `writes` writes
without clobbering (create-if-absent, replace-whole, copy into place); `faults` says in one
line why a write failed (a full disk, a quota, a denied bucket) and which retries the
bucket clients made; `results` is the MLPerf submission layout (`results/<system>/
<benchmark>/result_<i>.txt`, `systems/`, `runs/`); `pending` the runs in progress in it
(pending logs, records, heartbeats, publishing a result). Imports nothing of mlbench but
`mlbench.errors`.
"""
