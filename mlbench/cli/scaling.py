"""Options shared by `run` and `check`: the mesh, the scaling techniques, the
multi-host settings and the compilation cache."""

from __future__ import annotations

from typing import Any

import click

from mlbench.config import PRECISIONS, InputMode, compile_cache_dir, parse_mesh


def scaling_options(fn):
  """Adds --mesh, --weight-update-sharding, --bn-group-size, --input-mode, --precision,
  the multi-host options and --compile-cache to a command."""
  options = [
      click.option("--mesh", metavar="AXIS=N,...", envvar="MLBENCH_MESH",
                   help="Device mesh, e.g. data=4,model=2 (axes: data, model, expert, "
                        "spatial: split images by height, stage: pipeline stages, with "
                        "--set pipeline.microbatches=M). [default: every device on data]"),
      click.option("--weight-update-sharding/--no-weight-update-sharding", default=False,
                   envvar="MLBENCH_WEIGHT_UPDATE_SHARDING",
                   help="Shard the optimizer state and the weight update over the "
                        "data-parallel replicas."),
      click.option("--bn-group-size", type=click.IntRange(min=1), envvar="MLBENCH_BN_GROUP_SIZE",
                   help="Batch-norm statistics over groups of this many data-parallel devices. "
                        "[default: the config's model.bn_group_examples examples a group "
                        "(EfficientNet's full config: 128), else the whole global batch]"),
      click.option("--input-mode", type=click.Choice([m.value for m in InputMode]),
                   default=InputMode.DETERMINISTIC.value, show_default=True,
                   envvar="MLBENCH_INPUT_MODE",
                   help="fast lets tf.data hand out elements out of order."),
      click.option("--precision", type=click.Choice(PRECISIONS), envvar="MLBENCH_PRECISION",
                   help="Matmul and activation precision (parameters, optimizer state, losses "
                        "and norms stay float32). [default: bfloat16 for full configs on TPU "
                        "and GPU, the config's own otherwise]"),
      click.option("--coordinator", metavar="HOST:PORT", envvar="MLBENCH_COORDINATOR",
                   help="jax.distributed coordinator of a multi-host run (process 0's address)."),
      click.option("--num-processes", type=click.IntRange(min=1), envvar="MLBENCH_NUM_PROCESSES",
                   help="Processes in a multi-host run."),
      click.option("--process-id", type=click.IntRange(min=0), envvar="MLBENCH_PROCESS_ID",
                   help="This process's index in a multi-host run."),
      click.option("--compile-cache", metavar="DIR|off", envvar="MLBENCH_COMPILE_CACHE",
                   help="Keep compiled programs in DIR (JAX's persistent compilation cache) "
                        "so the next run of the same config loads them instead of compiling; "
                        "off: compile every time. [default: $JAX_COMPILATION_CACHE_DIR, else "
                        "$MLBENCH_CACHE_DIR/jax or ~/.cache/mlbench/jax]"),
  ]
  for option in reversed(options):
    fn = option(fn)
  return fn


def scaling_config(values: dict[str, Any]) -> dict[str, Any]:
  """RunConfig fields from the options above."""
  return {"mesh": parse_mesh(values["mesh"]) if values["mesh"] else None,
          "weight_update_sharding": values["weight_update_sharding"],
          "bn_group_size": values["bn_group_size"],
          "input_mode": InputMode(values["input_mode"]),
          "coordinator": values["coordinator"], "num_processes": values["num_processes"],
          "process_id": values["process_id"], "precision": values["precision"],
          "compile_cache": compile_cache_dir(values["compile_cache"])}
