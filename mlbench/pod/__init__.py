"""The compile-only side: what a config needs on a pod, without the pod.

`check` compiles a plan's programs from shapes alone and reports memory,
FLOPs and collectives, and predicts the time to train (`timemodel`, with the
constants the calibration fitted: data in accelerators.yaml); `plan` searches
slices and batches for the fastest or cheapest. It builds on `mlbench.train`
(it compiles the same steps a run compiles). The calibration itself is research
tooling outside the package (benchmarks/calibration/).
"""
