"""End to end through the real CLI: the Transformer mini run to its target, checked
officially.

Slow (a few minutes): trains for real on 8 simulated CPU devices. CI runs it.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_the_transformer_mini_run_reaches_its_target_with_a_compliant_log(mini_run):
  run = mini_run("transformer", "transformer")
  logged = {d["key"]: d for d in run.lines}
  assert logged["submission_benchmark"]["value"] == "transformer"
  assert logged["max_sequence_length"]["metadata"]["method"] == "discard"
  assert logged["opt_adam_epsilon"]["value"] == 1e-9
  assert [d["metadata"]["epoch_num"] for d in run.evals] == list(range(1, len(run.evals) + 1))
  assert run.reached_only_at_the_end()
