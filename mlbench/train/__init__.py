"""The run side: everything `mlbench run` does to train a workload to its target.

`runner` runs the requested runs and files their logs; `plan` validates a request
into a plan; `loop` is the time-to-quality loop; `steps` builds and compiles the
init, train and eval programs (the only place that calls `jax.jit`); `optim`,
`layers` and `data` are the helpers workloads build on (MLPerf optimizers,
distributed batch norm, tf.data pipelines); `mesh`, `sharding` and `runtime`
place the work on devices and hosts; `evaluate`, `clock` and `progress` measure
it; `lifecycle/` keeps the run's work and sees it through starts, stops and ends
(checkpoints, resume, the run folder's lease, signals, filing the log). Nothing here
imports `mlbench.verify`.
"""
