"""Official tools run in worker processes: exceptions, hangs and crashes become outcomes."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from mlbench.errors import Interrupted
from mlbench.verify import official, rcp, screen
from mlbench.resultlog import ResultLog


def test_values_exceptions_and_hangs_are_all_outcomes():
  with official.Isolated(processes=2, timeout_s=3) as tools:
    out = tools.map(int, [("7",), ("x",)])
    assert out[0].value == 7 and out[0].error is None
    assert out[1].error.startswith("ValueError: invalid literal")
    hung = tools.map(time.sleep, [(60,), (0,)])
    assert hung[0].error == "timed out after 3 s"
    assert hung[1].error is None  # Resubmitted to a fresh pool after the hang.
    assert tools.call(int, "8").value == 8


def test_a_worker_that_dies_is_reported_as_a_crash_with_its_exit_code_or_signal():
  with official.Isolated(processes=1, timeout_s=60) as tools:
    start = time.monotonic()
    assert tools.call(os._exit, 3).error == "the worker process crashed: it exited with code 3"
    assert tools.call(os.abort).error == "the worker process crashed: killed by SIGABRT (signal 6)"
    assert time.monotonic() - start < 30  # Told at once, not after the time limit.
    assert tools.call(abs, -2).value == 2  # A fresh worker took the dead one's place.


def test_the_compliance_tool_reports_verdicts_and_messages(tmp_path):
  log = tmp_path / "bad.txt"
  log.write_text(':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", '
                 '"key": "submission_benchmark", "value": "resnet", "metadata": {}}\n')
  with official.Isolated(1, 60) as tools:
    out = tools.call(official._tool_compliance, str(log), "training", "4.0.0", None)
  assert out.error is None and out.value["valid"] is False
  assert any("init_start" in m for m in out.value["errors"])


REAL = (Path(__file__).parents[1] / "data/mlperf-results/v4.0/Dell/results/XE9680x8H100-SXM-80GB"
        / "bert/result_0.txt")


def _with_line(tmp_path, line, at=30, name="log.txt"):
  """The real log with `line` inserted as line `at + 1`."""
  lines = REAL.read_text().splitlines(keepends=True)
  path = tmp_path / name
  path.write_text("".join(lines[:at]) + line + "\n" + "".join(lines[at:]))
  return path


def _event(value):
  return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME",
                                   "key": "note", "value": value, "metadata": {}})


def test_a_hung_checker_is_stopped_naming_the_file_and_line(tmp_path):
  # 200 KB: the official parser's regex needs minutes on it (quadratic in the length).
  log = _with_line(tmp_path, _event("x" * 200_000))
  with official.Isolated(1, timeout_s=2) as tools:
    start = time.monotonic()
    out = tools.call(official._tool_compliance, str(log), "training", "4.0.0", None)
  assert out.error == "timed out after 2 s reading log.txt, near line 31"
  assert time.monotonic() - start < 15


@pytest.mark.parametrize("line, raised", [
    (':::MLLOG {"time_ms": 5, "key": "x", "metadata": {}}', "KeyError"),
    (":::MLLOG [1, 2, 3]", "TypeError"),
    (':::MLLOG {"time_ms": [1], "key": "x", "value": 1, "metadata": {}}', "TypeError"),
    (":::MLLOG " + "[" * 20_000 + "]" * 20_000, "RecursionError"),
    (':::MLLOG {"key": "eval_accuracy", oops', None),  # a parse error the checker reports
])
def test_the_screen_flags_exactly_the_lines_that_crash_the_official_checker(tmp_path, line, raised):
  path = _with_line(tmp_path, line)
  found = screen.check(ResultLog.read(path), "4.0.0")
  with official.Isolated(1, 60) as tools:  # What the official checker itself does with it.
    out = tools.call(official._tool_compliance, str(path), "training", "4.0.0", None)
  if raised is None:
    assert found is None
    assert out.error is None and out.value["valid"] is False
    assert "Log lines had parsing errors." in out.value["errors"]
  else:
    assert found.lineno == 31 and f"would crash the official parser ({raised}" in found.reason
    assert out.error.startswith(raised)


def test_the_screen_flags_lines_too_long_for_the_official_parser(tmp_path):
  fine = ResultLog.read(REAL)
  assert screen.check(fine, "4.0.0") is None
  assert fine.longest[1] < 2_300 and fine.squares < screen.MAX_SQUARES / 100
  one = screen.check(ResultLog.read(_with_line(tmp_path, _event("x" * 70_000))), "4.0.0")
  assert one.lineno == 31 and "line 31 is 70," in one.reason
  many = "\n".join(_event("y" * 40_000) for _ in range(12))
  together = screen.check(ResultLog.read(_with_line(tmp_path, many, name="b.txt")), "4.0.0")
  assert together.lineno == 31 and "too long together" in together.reason


SSD = REAL.parents[1] / "ssd"  # Dell's five v4.0 ssd runs: the RCP check passes


@pytest.fixture
def rcp_folder(tmp_path, monkeypatch):
  """A copy of SSD with what the RCP check must not follow beside the logs, and temporary
  folders made where the test can see them."""
  folder = tmp_path / "user" / "ssd"
  shutil.copytree(SSD, folder)
  os.mkfifo(folder / "notes.fifo")
  (folder / "dangling").symlink_to(tmp_path / "gone")
  (folder / "data").symlink_to(tmp_path.parent)    # a link to a large tree
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
  (tmp_path / "tmp").mkdir()
  return folder


def _logs(folder):
  return sorted(folder.glob("result_*.txt"))


def test_the_rcp_check_writes_nothing_beside_the_logs_and_leaves_nothing(rcp_folder):
  before = sorted(p.name for p in rcp_folder.iterdir())
  with official.Isolated(1, 60) as tools:
    out = rcp.rcp(tools, _logs(rcp_folder), "training", "4.0.0", False)
    assert out.error is None and out.value["passed"] is True, out
    assert sorted(p.name for p in rcp_folder.iterdir()) == before  # no scaling.json here
    assert list((rcp_folder.parents[1] / "tmp").iterdir()) == []
    # A worker killed for its time limit cannot remove its folder: none was its own.
    slow = official.Isolated(1, 0.5)
    out = rcp.rcp(slow, _logs(rcp_folder), "training", "4.0.0", False)
    slow.close()
    assert out.error == "timed out after 0.5 s"
    assert list((rcp_folder.parents[1] / "tmp").iterdir()) == []


def test_a_sigterm_during_the_rcp_check_kills_the_worker_and_removes_the_copy(rcp_folder):
  copies = rcp_folder.parents[1] / "tmp"

  def terminate_once_copied():
    deadline = time.monotonic() + 60
    while not any(copies.iterdir()) and time.monotonic() < deadline:
      time.sleep(0.005)
    os.kill(os.getpid(), signal.SIGTERM)

  returned = False
  threading.Thread(target=terminate_once_copied, daemon=True).start()
  with pytest.raises(Interrupted, match="^interrupted by SIGTERM; nothing was written$"):
    with official.sigterm_raises(), official.Isolated(1, 60) as tools:
      rcp.rcp(tools, _logs(rcp_folder), "training", "4.0.0", False)
      returned = True
      time.sleep(60)  # Only if the signal came late: it must still come in here.
  assert not returned and list(copies.iterdir()) == []
  assert multiprocessing.active_children() == []


def test_an_rcp_error_names_the_users_file(rcp_folder):
  log = rcp_folder / "result_3.txt"
  log.write_text(re.sub(r'("key": "eval_accuracy", "value": [0-9.]+, "metadata": )\{[^}]*\}',
                        r"\1{}", log.read_text()))
  with official.Isolated(1, 60) as tools:
    out = rcp.rcp(tools, _logs(rcp_folder), "training", "4.0.0", False)
  line = next(n for n, text in enumerate(log.read_text().splitlines(), 1)
              if '"key": "eval_accuracy"' in text)
  assert out.error == f"cannot read result_3.txt (line {line}: KeyError: 'epoch_num')"
  copies = str(rcp_folder.parents[1] / "tmp")
  assert not any(copies in m for m in out.messages)
