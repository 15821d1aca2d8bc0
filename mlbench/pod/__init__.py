"""The compile-only side: what a config needs on a pod, without the pod.

`check` compiles a plan's programs from shapes alone and reports memory,
FLOPs and collectives. It builds on `mlbench.train` (it compiles the same
steps a run compiles).
"""
