"""The time model's calibration: research tooling, outside the package mlbench installs.

It fits the constants of `mlbench.pod.timemodel` on published MLPerf runs and writes
what the package reads at run time: the constants (mlbench/accelerators.yaml,
`time_model`) and the compiled cost table (mlbench/pod/calibration_costs.json, read by
`mlbench.pod.costtable`). `mlbench check` and `mlbench plan` never import it.

    runlog   what a published log says about its run (samples, blocks, warm-up)
    cases    the calibration set (which runs, on which slice) and each case's inputs
    fit      the fit of the constants, leave-one-out, and writing them
    costs    compiling the cost table (needs libtpu; hours)

Run from the repository root, naming where the published logs are:

    python -m benchmarks.calibration.fit --results ../shared/mlperf-results [--write]
    python -m benchmarks.calibration.costs [--only ssd@b32/m1] [--missing]

benchmarks/pod_prediction.py prints the whole table, benchmarks/plan_v2.py holds
`mlbench plan` against the v2.0 submissions.
"""
