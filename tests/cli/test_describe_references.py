"""`mlbench describe --config full` lists what each full config was checked against: the
reference's file and lines and its commit, per setting (each workload's README.md)."""

from __future__ import annotations

import json
import re

import pytest

from mlbench import registry
from mlbench.cli import info, main

BUILT_IN = ("bert", "efficientnet", "gpt_oss_20b", "llama31_8b", "moe", "resnet50", "ssd",
            "transformer", "vit")


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_full_config_names_its_references(name):
  rows = info.references(registry.get(name))
  assert len(rows) >= 5
  for row in rows:
    assert list(row) == ["Setting", "Full config", "Reference file and lines", "Commit"]
    assert all(row.values()), row
    assert re.search(r"L\d+", row["Reference file and lines"]) or ".yaml" in row[
        "Reference file and lines"], row  # a line, or a whole rules file
    assert re.search(r"@[0-9a-f]{7,}|@v?\d|mlperf-logging \d|this repository", row["Commit"]), row


def test_describe_full_prints_them_and_json_carries_them(capsys):
  assert main(["describe", "ssd", "--config", "full", "--json"]) == 0
  described = json.loads(capsys.readouterr().out)
  assert described["references"] == info.references(registry.get("ssd"))
  assert main(["describe", "ssd", "--config", "mini", "--json"]) == 0
  assert "references" not in json.loads(capsys.readouterr().out)
