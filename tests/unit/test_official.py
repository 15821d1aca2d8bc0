"""Official tools run in worker processes: exceptions, hangs and crashes become outcomes."""

from __future__ import annotations

import os
import time

from mlbench.verify import official


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
