"""The launch examples parse, and the `mlbench run` in each is a command mlbench accepts.

The examples' `srun` line runs on a real one-node SLURM in test_bucket_runs.py.
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
from pathlib import Path

import click
import yaml

from mlbench.storage import paths
from mlbench.cli.run import run_cmd

ROOT = Path(__file__).parents[2]
PATH_OPTIONS = ("--data-dir", "--results-dir", "--checkpoint-dir", "--compile-cache")


def _accepted(argv: list[str]) -> click.Context:
  """Parses `mlbench run ...` arguments as the CLI does (types, choices, ranges), without
  running anything; every path option is one the path layer takes."""
  assert argv[:2] == ["mlbench", "run"], argv
  ctx = run_cmd.make_context("run", argv[2:])
  for option, value in zip(argv, argv[1:]):
    if option in PATH_OPTIONS:
      paths.path(value, option)
  return ctx


def test_the_jobset_runs_one_pod_per_tpu_host_of_the_slice():
  doc = yaml.safe_load((ROOT / "examples" / "gke-tpu-v5e-16.jobset.yaml").read_text())
  assert (doc["apiVersion"], doc["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
  [job] = doc["spec"]["replicatedJobs"]
  spec = job["template"]["spec"]
  pod = spec["template"]["spec"]
  [container] = pod["containers"]
  chips = container["resources"]["limits"]["google.com/tpu"]
  topology = pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"]
  hosts = spec["parallelism"]
  assert spec["completions"] == hosts and hosts * chips == math.prod(map(int, topology.split("x")))
  assert pod["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == "tpu-v5-lite-podslice"
  ctx = _accepted(container["command"])
  assert ctx.params["results_dir"].startswith("gs://") and ctx.params["coordinator"] is None


def test_the_sbatch_script_runs_one_srun_task_per_gpu():
  script = (ROOT / "examples" / "slurm-gpu.sbatch").read_text()
  assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0
  directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", script, re.M))
  assert directives["ntasks-per-node"] == directives["gpus-per-node"] == "8"
  [line] = [ln for ln in script.replace("\\\n", " ").splitlines() if ln.startswith("srun ")]
  shared = re.search(r"^SHARED=(\S+)", script, re.M)[1]
  argv = shlex.split(line.replace("$SHARED", shared))
  ctx = _accepted(argv[argv.index("mlbench"):])
  assert ctx.params["checkpoint_every"] == 2000 and ctx.params["num_processes"] is None


def test_the_readme_tpu_vm_command_runs_mlbench_on_every_worker():
  readme = (ROOT / "README.md").read_text()
  block = readme.split("<!-- launch-tpu-vm -->", 1)[1].split("```", 2)[1]
  argv = shlex.split(block.removeprefix("bash\n"))
  assert argv[:4] == ["gcloud", "compute", "tpus", "tpu-vm"] and "--worker=all" in argv
  command = argv[argv.index("--command") + 1]
  ctx = _accepted(shlex.split(command))
  assert ctx.params["config_name"] == "full" and ctx.params["data_dir"].startswith("gs://")
