"""The one reader of MLPerf logs (`mlbench.resultlog`): both formats, real line numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlbench.errors import UserError
from mlbench.resultlog import ResultLog

V06 = Path(__file__).parents[1] / "data" / "mlperf-v0.6" / "Google" / "results"


def _mllog(time_ms: float, key: str, value: object = None, **metadata: object) -> str:
  doc = {"namespace": "", "time_ms": time_ms, "event_type": "POINT_IN_TIME", "key": key,
         "value": value, "metadata": metadata}
  return ":::MLLOG " + json.dumps(doc)


def test_both_formats_are_events_in_file_order_and_only_mllog_lines_are_judged(tmp_path):
  log = tmp_path / "result_0.txt"
  log.write_text("\n".join([
      "a line of the program's own output",
      _mllog(1000, "run_start"),
      ':::MLL 1.5 eval_accuracy: {"value": 0.5, "metadata": {"epoch_num": 2}}',
      ":::MLLOG {not json",
      _mllog(61000, "run_stop", status="success"),
      _mllog(90000, "run_start"),  # a second run_start: the first one counts
  ]) + "\n")
  got = ResultLog.read(log)
  assert [(e.lineno, e.key) for e in got.lines] == [(2, "run_start"), (5, "run_stop"),
                                                   (6, "run_start")]
  assert [n for n, _, _ in got.errors] == [4]  # the malformed :::MLLOG line; the prose is none
  [old] = got.old_lines
  assert (old.lineno, old.time_ms, old.value, old.metadata) == (3, 1500.0, 0.5, {"epoch_num": 2})
  assert [e.lineno for e in got.events] == [2, 3, 5, 6]
  assert got.time_to_train_ms == 60000 and got.success


def test_a_published_v06_log_is_read_with_its_seconds_and_line_numbers():
  got = ResultLog.read(V06 / "tpu-v3-128" / "resnet" / "result_0.txt")
  assert got.old_format and not got.lines and not got.errors
  start = next(e for e in got.events if e.key == "run_start")
  assert start.lineno == 19 and start.time_ms == pytest.approx(1558515660.674e3)
  assert got.time_to_train_ms is None  # compare scores :::MLLOG lines, as result_summarizer


def test_an_unreadable_log_is_one_line(tmp_path):
  with pytest.raises(UserError, match="cannot read the result log"):
    ResultLog.read(tmp_path)  # a folder
