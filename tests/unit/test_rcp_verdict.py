"""`mlbench compare`'s RCP column: the RCP checker's failure messages as short verdicts,
and anything else it says (or a crash's text) as one readable line."""

from __future__ import annotations

import inspect

from mlbench.verify import compare


def test_every_known_verdict_is_a_message_the_rcp_checker_returns():
  from mlperf_logging.rcp_checker import rcp_checker

  source = inspect.getsource(rcp_checker)
  for message in compare.RCP_VERDICTS:
    assert f"'{message}'" in source, message
  assert compare.rcp_verdict("Insufficient convergence") == "Too few converged"
  assert compare.rcp_verdict("Missing RCP, please submit RCP with BS = 640") == "Missing"


def test_an_unknown_message_is_one_short_line():
  raw = ("Traceback (most recent call last):\n  File \"rcp_checker.py\", line 540, in "
         "check_directory\n    rcp_mean = ...\nZeroDivisionError: float division by zero\n")
  line = compare.rcp_verdict(raw)
  assert "\n" not in line and len(line) <= 60 and line.endswith("…")
  assert line.startswith("Traceback (most recent call last): File \"rcp_checker.py\"")
  assert compare.rcp_verdict("  RCP not  found\tbut slower ") == "RCP not found but slower"
