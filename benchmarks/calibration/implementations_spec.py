"""Where each published run's own implementation says what it did: files, lines, patterns.

`implementation.extract` reads these from mlcommons/training_results_vX.Y (the commit it
finds there is stored beside the lines) and keeps every match of each pattern on the
lines named (all lines where none are). What the lines mean:

- Google's BERT (v0.7 TF and JAX, v2.0 TF): the run script's flags. `--max_seq_length`
  is the padded length (the input pipeline reads fixed 512-token features:
  `tf.FixedLenFeature([max_seq_length], ...)`); `--seq_len_buckets` / `--batch_size_buckets`
  with more than one bucket group sequences by length (v2.0 dataset_input.py L170-202,
  `group_by_window`) and run one program per bucket, sliced to the bucket's length and
  batch (run_pretraining.py L270-294, `tf.switch_case`). `--num_tpu_cores` (over
  `--num_partitions`) is the replica count.
- NVIDIA's and Dell's v4.0 BERT (PyTorch): the config's `BATCHSIZE` (sequences, or rows
  when packed, a GPU), `PACKING_FACTOR`, and `--unpad` (sequences without their padding)
  or `--packed_samples` (the packed data set) in `EXTRA_PARAMS`; phase 2's
  `--max_seq_length` in run_and_time.sh.
- The Transformer: packed WMT rows of 256 tokens in every run (Google's JAX
  `MAX_TRAIN_LEN`, Lingvo's `FixateInputShape(..., 256, 256)` with `packed_input`,
  tensor2tensor's `translate_ende_wmt32k_packed` problem, `packed_length` 256), the
  program mlbench's full config runs (workloads/transformer/config.py `packed`).
- ResNet-50 and SSD: fixed-size images; the flags give the replica layout
  (`--num_replicas`, `--num_shards`, `--input_partition_dims`: spatial partitions).
"""

from __future__ import annotations

import dataclasses

REPOS = {"v0.6": "training_results_v0.6", "v0.7": "training_results_v0.7",
         "v2.0": "training_results_v2.0", "v4.0": "training_results_v4.0"}


@dataclasses.dataclass(frozen=True)
class Source:
  round: str
  path: str
  pattern: str                       # a regex without groups; every match is kept
  lines: tuple[int, int] | None = None  # first and last line read (1-based)


_BERT_FLAGS = (r"--(?:max_seq_length|train_batch_size|num_tpu_cores|num_partitions|"
               r"seq_len_buckets|batch_size_buckets)=\d+")
_FIXED = r"tf\.FixedLenFeature\(\[max_seq_length\], tf\.int64\)"
_GB = "Google/benchmarks"


def _bert_v07(system: str, code: str, line: int) -> tuple[Source, ...]:
  impl = f"{_GB}/bert/implementations/bert-research-{system.split('-')[-1]}-" + \
      "-".join(system.split("-")[:-1]) + f"/{code}"
  return (Source("v0.7", f"{_GB}/bert/{system}/run_and_time.sh", _BERT_FLAGS),
          Source("v0.7", impl, _FIXED, (line, line)))


def _bert_v20(chips: int) -> tuple[Source, ...]:
  d = f"{_GB}/bert/implementations"
  impl = f"{d}/bert-cloud-tpu-v4-{chips}-TF"
  return (Source("v2.0", f"{d}/cloud-tpu-v4-{chips}-TF/run_bert_v4-{chips}.sh", _BERT_FLAGS),
          Source("v2.0", f"{impl}/dataset_input.py", _FIXED, (57, 57)),
          Source("v2.0", f"{impl}/dataset_input.py", r"\S.*", (170, 171)),
          Source("v2.0", f"{impl}/dataset_input.py", r"d = d\.group_by_window\(.*", (202, 202)),
          Source("v2.0", f"{impl}/run_pretraining.py", r"grads = tf\.switch_case\(.*",
                 (294, 294)))


_GPU_FLAGS = (r"^export (?:BATCHSIZE|PACKING_FACTOR)=\d+|"
              r"--(?:unpad|unpad_fmha|pad_fmha|packed_samples|exchange_padding)\b")
# The Lingvo params class each v0.7 TF Transformer run names with --model: its lines.
_LINGVO = {"tpu-v3-8192-TF": (558, 609), "tpu-v4-16-TF": (736, 778),
           "tpu-v4-128-TF": (647, 688), "tpu-v4-512-TF": (689, 735)}


def _lingvo(system: str) -> tuple[Source, ...]:
  params = (f"{_GB}/transformer/implementations/transformer-research-TF-"
            f"{system.removesuffix('-TF')}/lingvo/tasks/mt/params/mlperf.py")
  return (Source("v0.7", f"{_GB}/transformer/{system}/run_and_time.sh", r"--model=[\w.]+"),
          Source("v0.7", params, r"FixateInputShape\(p, self\.TRAIN_BATCH_SIZE, \d+, \d+\)|"
                 r"p\.packed_input = True", (303, 320)),
          Source("v0.7", params, r"TRAIN_BATCH_SIZE = \d+|global_batch_size = \d+|"
                 r"XLA_NUM_PARTITIONS = \d+", _LINGVO[system]))


def _t2t(cores: int) -> tuple[Source, ...]:
  return (Source("v0.6", f"{_GB}/transformer/tpu-v3-{cores}/run_and_time.sh",
                 r"--problem=\w+"),
          Source("v0.6", f"{_GB}/transformer/implementations/tpu-v3-{cores}-transformer/"
                 "transformer/data_generators/translate_ende.py",
                 r"class TranslateEndeWmt32kPacked|return \d+", (110, 114)))


def _images(rnd: str, script: str, flags: str) -> tuple[Source, ...]:
  return (Source(rnd, script, rf"--(?:{flags})=\d+"),)


_R = "Google/results"
SPEC: dict[str, tuple[Source, ...]] = {
    # BERT
    f"v0.7/{_R}/tpu-v3-8192-JAX/bert": _bert_v07("tpu-v3-8192-JAX", "input_pipeline.py", 27),
    **{f"v0.7/{_R}/{s}/bert": _bert_v07(s, "dataset_input.py", 58)
       for s in ("tpu-v3-8192-TF", "tpu-v4-16-TF", "tpu-v4-128-TF", "tpu-v4-512-TF")},
    **{f"v2.0/{_R}/cloud-tpu-v4-{n}-TF/bert": _bert_v20(n) for n in (6912, 8192)},
    "v4.0/NVIDIA/results/eos_n8_ngc23.04_pytorch/bert": (
        Source("v4.0", "NVIDIA/benchmarks/bert/implementations/eos_n8_ngc23.04_pytorch/"
               "config_DGXH100_8x8x72x1.sh", _GPU_FLAGS),
        Source("v4.0", "NVIDIA/benchmarks/bert/implementations/eos_n8_ngc23.04_pytorch/"
               "run_and_time.sh", r"--max_seq_length=\d+", (88, 103))),
    "v4.0/Dell/results/XE9680x8H100-SXM-80GB/bert": (
        Source("v4.0", "Dell/benchmarks/bert/implementations/pytorch/"
               "config_XE9680x8H100-SXM-80GB.sh", _GPU_FLAGS + r"|^export DATADIR_PHASE2=\S+"),
        Source("v4.0", "Dell/benchmarks/bert/implementations/pytorch/run_and_time.sh",
               r"--max_seq_length=\d+", (90, 105))),
    # Transformer
    f"v0.7/{_R}/tpu-v3-8192-JAX/transformer": (
        Source("v0.7", f"{_GB}/transformer/implementations/transformer-research-JAX-"
               "tpu-v3-8192/mlperf_input_pipeline.py", r"MAX_TRAIN_LEN = \d+.*", (22, 22)),),
    **{f"v0.7/{_R}/{s}/transformer": _lingvo(s) for s in _LINGVO},
    **{f"v0.6/Google/results/tpu-v3-{n}/transformer": _t2t(n)
       for n in (32, 128, 256, 512, 1024, 2048)},
    # ResNet-50 and SSD: fixed-size images; the replica layout
    **{f"v0.7/{_R}/{s}/resnet": _images("v0.7", f"{_GB}/resnet/{s}/run_and_time.sh",
                                        "num_replicas|train_batch_size")
       for s in ("tpu-v3-8192-TF", "tpu-v4-16-TF", "tpu-v4-128-TF", "tpu-v4-512-TF")},
    **{f"v0.7/{_R}/{s}/ssd": _images("v0.7", f"{_GB}/ssd/{s}/run_and_time.sh",
                                     "num_shards|input_partition_dims|train_batch_size")
       for s in ("tpu-v3-8192-TF", "tpu-v4-16-TF", "tpu-v4-128-TF", "tpu-v4-512-TF")},
    f"v0.7/{_R}/tpu-v3-4096-JAX/ssd": _images(
        "v0.7", f"{_GB}/ssd/tpu-v3-4096-JAX/run_and_time.sh",
        "num_partitions|global_batch_size"),
    **{f"v2.0/{_R}/cloud-tpu-v4-{n}-TF/resnet": _images(
        "v2.0", f"{_GB}/resnet/implementations/cloud-tpu-v4-{n}-TF/run_resnet_v4-{n}.sh",
        "num_replicas|train_batch_size") for n in (6912, 8192)},
}
