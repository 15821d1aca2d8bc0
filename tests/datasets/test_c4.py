"""`mlbench data prepare c4`: C4-like json(.gz) lines tokenised by a tokenizer trained here,
written as Megatron datasets, read back by the llama31_8b workload's own pipeline."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from mlbench.cli import main

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards", "quietly", "judge", "boxing", "matches", "near", "the", "old", "river", "bank", "under", "grey", "skies"]


def _texts(n: int, seed: int) -> list[str]:
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, size=int(rng.integers(5, 40)))) for _ in range(n)]


def _tokenizer(path: Path) -> Path:
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.train_from_iterator(_texts(200, 0), trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<unk>", "<|end_of_text|>"]))
  tok.save(str(path))
  return path


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> tuple[Path, Path, dict[str, list[str]]]:
  root = tmp_path_factory.mktemp("c4")
  folder = root / "raw"
  (folder / "en").mkdir(parents=True)
  texts = {"c4-train.en_6": _texts(300, 1), "c4-validation-91205-samples.en": _texts(80, 2),
           "c4-train.en_7": _texts(50, 3)}
  for name, lines in texts.items():
    body = "".join(json.dumps({"text": t, "timestamp": "2019", "url": "u"}) + "\n" for t in lines)
    if name.endswith("en_7"):
      (folder / "en" / f"{name}.json").write_text(body)  # plain json, in a subfolder
    else:
      with gzip.open(folder / f"{name}.json.gz", "wt") as f:
        f.write(body)
  return folder, _tokenizer(root / "tokenizer.json"), texts


def _prepare(raw_dir: Path, out: Path, tok: Path, *extra: str) -> int:
  return main(["data", "prepare", "c4", "--raw", str(raw_dir), "--out", str(out),
               "--tokenizer", str(tok), *extra])


def _bytes(out: Path) -> dict[str, bytes]:
  return {p.name: p.read_bytes() for p in sorted(out.glob("*_text_document.*"))}


def test_c4_is_tokenised_into_megatron_datasets_the_workload_reads(raw, tmp_path):
  from tokenizers import Tokenizer

  from mlbench.datasets import indexed
  raw_dir, tok_path, texts = raw
  out = tmp_path / "out"
  assert _prepare(raw_dir, out, tok_path, "--workers", "1") == 0
  tok = Tokenizer.from_file(str(tok_path))
  for name, lines in texts.items():
    ds = indexed.IndexedDataset(out / f"{name}_text_document")
    assert ds.dtype == np.uint16 and len(ds) == len(lines)
    for i in (0, len(lines) // 2, len(lines) - 1):  # as NeMo's script without --append-eod
      assert ds.get(i).tolist() == tok.encode(lines[i], add_special_tokens=False).ids
  manifest = json.loads((out / "mlbench-data.json").read_text())
  assert manifest["records"] == sum(map(len, texts.values())) and manifest["complete"]
  _one_batch_through_the_workload(out)


def _one_batch_through_the_workload(out: Path) -> None:
  from mlbench.train import data
  from mlbench.workload import Split
  from workloads.llama31_8b import config, input_pipeline
  from workloads.llama31_8b.config import Source

  cfg = config.full()
  cfg = dataclasses.replace(cfg, global_batch_size=4, train_budget_steps=10, data=dataclasses.replace(
      cfg.data, source=Source.C4, seq_length=32, eval_examples=16))
  train = input_pipeline.examples(cfg, out, Split.TRAIN, seed=3)
  batch = next(data.example_batches(train, per_host_batch=4, host=0, hosts=1))
  assert batch["tokens"].shape == (4, 33) and batch["tokens"].dtype == np.int32
  assert batch["tokens"].max() < 300
  evals = input_pipeline.examples(cfg, out, Split.EVAL, seed=3)
  assert len(evals) == 16


def test_tokens_are_the_references_and_an_end_of_document_token_only_on_request(raw, tmp_path):
  """The reference's preprocess.sh runs NeMo's preprocess_data_for_megatron.py without
  --append-eod, and NeMo writes no document for a text with no tokens (v2.1.0 L181-182,
  L348-349): the token stream is the documents' tokens back to back, nothing between."""
  from tokenizers import Tokenizer

  from mlbench.datasets import indexed
  tok_path = raw[1]
  texts = ["the quick fox", "", "a lazy dog"]
  (tmp_path / "raw").mkdir()
  (tmp_path / "raw" / "c4-train.en_6.json").write_text(
      "".join(json.dumps({"text": t}) + "\n" for t in texts))
  tok = Tokenizer.from_file(str(tok_path))
  want = [tok.encode(t, add_special_tokens=False).ids for t in texts if t]
  for extra, tail in ((), []), (("--eod", "auto"), [tok.token_to_id("<|end_of_text|>")]):
    out = tmp_path / f"out{len(tail)}"
    assert _prepare(tmp_path / "raw", out, tok_path, "--workers", "1", *extra) == 0
    ds = indexed.IndexedDataset(out / "c4-train.en_6_text_document")
    assert [ds.get(i).tolist() for i in range(len(ds))] == [w + tail for w in want]


def test_an_interrupted_prepare_resumes_byte_identically(raw, tmp_path, capsys):
  raw_dir, tok_path, _ = raw
  out = tmp_path / "out"
  assert _prepare(raw_dir, out, tok_path, "--workers", "2") == 0
  first = _bytes(out)
  # An interrupt: one shard's index never made it, another left a temporary file behind.
  (out / "c4-train.en_6_text_document.idx").unlink()
  (out / ".c4-train.en_7_text_document.bin.tmp-1234").write_bytes(b"half")
  capsys.readouterr()
  assert _prepare(raw_dir, out, tok_path, "--dry-run") == 0
  plan = capsys.readouterr()  # a dry run's product, what it would write, is on stdout
  assert "1 of 3 shards to write" in plan.out and "to write  c4-train.en_6_text_document.bin" \
      in plan.out and "shards to write" not in plan.err
  assert _prepare(raw_dir, out, tok_path, "--workers", "1") == 0
  assert "wrote 1 shard(s), skipped 2 finished" in capsys.readouterr().err
  assert _bytes(out) == first


def _one_line(capsys) -> str:
  err = capsys.readouterr().err
  assert err.startswith("error: ") and err.count("\n") == 1, err
  return err


def test_receipts_record_what_shapes_the_bytes_and_other_options_are_refused(raw, tmp_path,
                                                                            capsys):
  from importlib import metadata

  raw_dir, tok_path, _ = raw
  out = tmp_path / "out"
  assert _prepare(raw_dir, out, tok_path, "--workers", "1") == 0
  receipt = json.loads((out / ".mlbench" / "c4-train.en_6_text_document.json").read_text())
  manifest = json.loads((out / "mlbench-data.json").read_text())
  assert receipt["options"] == manifest["options"] and receipt["options"] == {
      "mlbench": metadata.version("mlbench"), "tokenizers": metadata.version("tokenizers"),
      "tokenizer": receipt["options"]["tokenizer"], "end of document": "none",
      "token dtype": "uint16"}
  assert receipt["options"]["tokenizer"].startswith("sha256 ")
  before = _bytes(out)
  capsys.readouterr()
  for extra in (("--eod", "auto"), ("--eod", "auto", "--dry-run")):
    assert _prepare(raw_dir, out, tok_path, *extra) == 2
    assert _one_line(capsys) == (
        f"error: --out {out} holds shards prepared with other options (end of document: none "
        "there, token id 1 now); prepare into another --out, or delete "
        f"{out} to prepare it again with these options\n")
  assert _bytes(out) == before  # nothing mixed in


def test_damaged_receipts_and_manifests_are_one_line_or_written_again(raw, tmp_path, capsys):
  raw_dir, tok_path, _ = raw
  out = tmp_path / "out"
  assert _prepare(raw_dir, out, tok_path, "--workers", "1") == 0
  before = _bytes(out)
  (out / ".mlbench" / "c4-train.en_7_text_document.json").write_text("")  # emptied
  manifest = out / "mlbench-data.json"
  manifest.write_text(manifest.read_text()[:100])  # truncated
  capsys.readouterr()
  assert main(["data", "verify", "c4", str(out)]) == 2
  assert f"error: {manifest} is damaged (JSONDecodeError: " in _one_line(capsys)
  assert main(["run", "llama31_8b", "--config", "full", "--data-dir", str(out)]) == 2
  assert f"error: {manifest} is damaged" in _one_line(capsys)
  assert _prepare(raw_dir, out, tok_path, "--workers", "1") == 0
  err = capsys.readouterr().err
  assert (f"note: .mlbench/c4-train.en_7_text_document.json in {out} is damaged (empty or "
          "truncated); its shard is written again") in err
  assert "wrote 1 shard(s), skipped 2 finished" in err and _bytes(out) == before
  assert main(["data", "verify", "c4", str(out)]) == 0


def test_an_unreadable_file_is_listed_and_the_rest_is_written(raw, tmp_path, capsys):
  raw_dir, tok_path, _ = raw
  mixed = tmp_path / "mixed"
  mixed.mkdir()
  for p in raw_dir.glob("*.json.gz"):
    (mixed / p.name).write_bytes(p.read_bytes())
  (mixed / "c4-train.broken.json.gz").write_bytes(b"not gzip at all")
  out = tmp_path / "out"
  assert _prepare(mixed, out, tok_path, "--workers", "1") == 1
  err = capsys.readouterr().err
  assert "shard not written: " in err and "c4-train.broken.json.gz" in err
  assert (out / "c4-train.en_6_text_document.idx").is_file()
  assert not list(out.glob("c4-train.broken*"))


@pytest.mark.parametrize("setup, message", [
    (lambda d: None, "error: no *.json or *.json.gz files under"),
    (lambda d: (d / "x.txt").write_text("hi"), "error: no *.json or *.json.gz files under"),
])
def test_a_wrong_layout_is_one_line_with_exit_code_2(raw, tmp_path, capsys, setup, message):
  empty = tmp_path / "empty"
  empty.mkdir()
  setup(empty)
  assert _prepare(empty, tmp_path / "out", raw[1]) == 2
  err = capsys.readouterr().err
  assert err.startswith(message) and err.count("\n") == 1


def test_a_missing_tokenizer_is_one_line(raw, tmp_path, capsys):
  assert _prepare(raw[0], tmp_path / "out", tmp_path / "nope.json") == 2
  err = capsys.readouterr().err
  assert err.startswith("error: --tokenizer") and err.count("\n") == 1


def test_verify_checks_the_megatron_files_the_workload_reads(raw, tmp_path, capsys):
  raw_dir, tok_path, _ = raw
  out = tmp_path / "out"
  assert _prepare(raw_dir, out, tok_path, "--workers", "1") == 0
  capsys.readouterr()
  assert main(["data", "verify", "c4", str(out), "--full"]) == 0
  table = capsys.readouterr().out
  assert "c4-train.en_6_text_document" in table and "300 documents" in table
  assert "WRONG" not in table
  # A .bin cut short: its size no longer matches the index (quick check, no --full).
  bin_file = out / "c4-validation-91205-samples.en_text_document.bin"
  bin_file.write_bytes(bin_file.read_bytes()[:-2])
  assert main(["data", "verify", "c4", str(out)]) == 1
  captured = capsys.readouterr()
  assert "c4-validation-91205-samples.en_text_document, c4 sizes" in captured.err
  assert ".bin holds" in captured.out


def test_run_refuses_a_half_prepared_set_before_it_starts(raw, tmp_path, capsys):
  from mlbench.datasets import check

  raw_dir, tok_path, _ = raw
  out = tmp_path / "out"
  assert _prepare(raw_dir, out, tok_path, "--workers", "1") == 0
  check.require_complete(out)  # complete: no complaint
  (out / "c4-train.en_6_text_document.bin").unlink()
  capsys.readouterr()
  assert main(["run", "llama31_8b", "--config", "full", "--data-dir", str(out)]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"error: the dataset in {out} is not complete (files sizes: expected 6 "
                        "as written, found 1 missing or changed") and err.count("\n") == 1


@pytest.mark.slow
def test_one_train_step_of_llama_on_the_prepared_tokens(raw, tmp_path):
  """The full config's data path and model family, at the mini config's size (the vocabulary
  cut to the test tokenizer's), through the harness's compiled train step."""
  import jax

  from mlbench.train import data, steps
  from mlbench.train import mesh as mesh_lib
  from mlbench.workload import Split, StepContext
  from workloads.llama31_8b import WORKLOAD, config, input_pipeline
  from workloads.llama31_8b.config import Source

  raw_dir, tok_path, _ = raw
  out = tmp_path / "out"
  assert _prepare(raw_dir, out, tok_path, "--workers", "1") == 0
  mini, full = config.mini(), config.full()
  cfg = dataclasses.replace(
      mini, name="full", global_batch_size=8, train_budget_steps=4,
      model=dataclasses.replace(mini.model, vocab_size=300, num_layers=1),
      data=dataclasses.replace(full.data, source=Source.C4, seq_length=32, eval_examples=8))
  sched = WORKLOAD.schedule(cfg)
  mesh = mesh_lib.make_mesh()
  programs = steps.compile_programs(WORKLOAD, cfg, sched, mesh, StepContext(mesh=mesh),
                                    WORKLOAD.optimizer(cfg, sched))
  batch = next(data.example_batches(input_pipeline.examples(cfg, out, Split.TRAIN, seed=0),
                                    per_host_batch=8, host=0, hosts=1))
  state, sums = programs.train(programs.init_state(0), programs.fresh_sums(),
                               mesh_lib.to_global(batch, programs.batch_sharding, 8))
  loss = float(jax.device_get(sums)["loss"])
  assert np.isfinite(loss) and int(jax.device_get(state.step)) == 1


def _grandchildren(pid: int) -> list[int]:
  """The workers of a prepare: children of its fork server, itself a child of `pid`."""
  parents = {}
  for stat in Path("/proc").glob("[0-9]*/stat"):
    try:
      parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
      continue
  children = {p for p, pp in parents.items() if pp == pid}
  return sorted(p for p, pp in parents.items() if pp in children)


def test_a_killed_prepare_resumes_byte_identically(raw, tmp_path, processes):
  """SIGKILL to the whole job (main process and workers) once some shards are done; then,
  in the job that resumes it, SIGKILL to one worker: that job writes the lost shards with
  a fresh pool and ends as if nothing had happened."""
  import os
  import signal
  import time

  tok_path = raw[1]
  many = tmp_path / "many"
  many.mkdir()
  body = "".join(json.dumps({"text": t}) + "\n" for t in _texts(400, 9))
  for i in range(40):
    (many / f"c4-train.{i:05d}-of-01024.json").write_text(body)
  whole, out = tmp_path / "whole", tmp_path / "out"
  assert _prepare(many, whole, tok_path, "--workers", "1") == 0
  args = ("data", "prepare", "c4", "--raw", many, "--out", out, "--tokenizer", tok_path,
          "--workers", "2")
  receipts = out / ".mlbench"

  def receipts_at_least(job, n: int) -> int:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job.poll() is None and (
        len(list(receipts.glob("*.json"))) < n if receipts.is_dir() else True):
      time.sleep(0.005)
    return len(list(receipts.glob("*.json")))

  [job] = processes.mlbench(*args)
  receipts_at_least(job, 3)
  job.kill()  # its process group: the main process and its workers
  done = len(list(receipts.glob("*.json")))
  assert 3 <= done < 40, f"the job was not caught mid-way ({done} of 40 shards done)"
  [job] = processes.mlbench(*args)
  receipts_at_least(job, done + 2)
  workers = _grandchildren(job.pid)
  assert workers and job.poll() is None, "the resumed job was not caught mid-way"
  os.kill(workers[0], signal.SIGKILL)
  end = job.wait(timeout=300)
  assert end.returncode == 0, end.stderr[-2000:]
  assert "note: a worker process died (killed, or out of memory?) while writing" in end.stderr
  assert _bytes(out) == _bytes(whole) and len(_bytes(out)) == 80
  assert not list(out.glob(".*tmp*"))
