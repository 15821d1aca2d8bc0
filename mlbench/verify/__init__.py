"""The verify side: reading, judging and scoring result logs and packages.

`validate` (with `checks`, `rounds`, `submission`) checks logs and whole
submission packages; `compare` (with `plots`) scores and compares them;
`official` runs the official MLPerf tools in isolated workers. Both read logs
with the base's one reader (`mlbench.resultlog`). Nothing here imports JAX or
`mlbench.train`.
"""
