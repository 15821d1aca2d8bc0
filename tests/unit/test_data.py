"""The harness's tf.data pipelines over real TFRecord files."""

from __future__ import annotations

import numpy as np
import pytest

from mlbench.datasets import records
from mlbench.train import data
from mlbench.errors import UserError

N = 103  # Not a multiple of any batch or host count used below.


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("records")
  examples = ({"id": i, "x": np.array([i, -i], np.float32)} for i in range(N))
  return records.write_shards(str(root / "part-{index:05d}-of-{count:05d}"), examples, 5)


def decode(record, seed):
  tf = data.tf()
  f = tf.io.parse_single_example(record, {"id": tf.io.FixedLenFeature([], tf.int64),
                                          "x": tf.io.FixedLenFeature([2], tf.float32)})
  noise = tf.random.stateless_uniform([], seed=seed, maxval=1000, dtype=tf.int64)
  return {"id": tf.cast(f["id"], tf.int32), "x": f["x"], "noise": noise}


@pytest.mark.parametrize("hosts", [1, 2, 3, 8])
def test_eval_shares_cover_the_set_exactly_once_with_padding(files, hosts):
  seen, steps = [], None
  for host in range(hosts):
    ds = data.eval_dataset(files, decode, num_examples=N, per_host_batch=4, host=host, hosts=hosts)
    batches = list(data.numpy_batches(ds))
    steps = steps or len(batches)
    assert len(batches) == steps == data.eval_steps(N, 4, hosts)  # Same on every host.
    for b in batches:
      assert b["id"].shape == (4,) and b["x"].shape == (4, 2)
      real = b[data.MASK] == 1
      seen += b["id"][real].tolist()
      assert (b["id"][~real] == 0).all() and (b["x"][~real] == 0).all()
  assert sorted(seen) == list(range(N))


def test_train_batches_are_reproducible_and_seeded(files):
  def first(seed, host=0, hosts=1, n=6):
    ds = data.train_dataset(files, decode, per_host_batch=8, seed=seed, host=host, hosts=hosts)
    it = data.numpy_batches(ds)
    return [next(it) for _ in range(n)]

  a, b, c = first(1), first(1), first(2)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x["id"], y["id"])
    np.testing.assert_array_equal(x["noise"], y["noise"])
  assert any((x["id"] != z["id"]).any() for x, z in zip(a, c))
  ids = np.concatenate([x["id"] for x in a])
  assert len(set(ids[:N].tolist())) == min(len(ids), N)  # No example twice within an epoch.
  np.testing.assert_array_equal(a[0]["x"][:, 0], a[0]["id"].astype(np.float32))


@pytest.mark.parametrize("skip", [1, 13, 30])
def test_a_resumed_pipeline_continues_with_exactly_the_same_batches(files, skip):
  """Skipping k batches (a resumed run) gives batches k, k+1, ... of the full run, with
  the same augmentation randomness, across epoch boundaries (13 batches of 8 > 103)."""
  def batches(skip_batches, n):
    ds = data.train_dataset(files, decode, per_host_batch=8, seed=4, host=1, hosts=2,
                            skip_batches=skip_batches)
    it = data.numpy_batches(ds)
    return [next(it) for _ in range(n)]

  whole, resumed = batches(0, skip + 4), batches(skip, 4)
  for x, y in zip(whole[skip:], resumed, strict=True):
    for key in ("id", "x", "noise"):
      np.testing.assert_array_equal(x[key], y[key])


def test_train_files_are_split_between_hosts(files):
  ids = []
  for host in range(2):
    it = data.numpy_batches(data.train_dataset(files, decode, per_host_batch=1, seed=0,
                                               host=host, hosts=2))
    per_epoch = sum(1 for i in range(N) if i % 5 in ((0, 2, 4) if host == 0 else (1, 3)))
    ids.append({int(next(it)["id"][0]) for _ in range(per_epoch)})
  assert not ids[0] & ids[1]
  assert ids[0] | ids[1] == set(range(N))


def test_more_hosts_than_files_is_a_clear_error(files):
  with pytest.raises(UserError, match="5 training files cannot be split over 6 hosts"):
    data.train_dataset(files, decode, per_host_batch=1, seed=0, host=5, hosts=6)


def test_prefetch_keeps_order_and_yields_everything():
  put_calls = []

  def put(x):
    put_calls.append(x)
    return x * 10

  out = list(data.prefetch(iter(range(5)), put, depth=2))
  assert out == [(i, i * 10) for i in range(5)] and put_calls == list(range(5))


def test_a_generated_dataset_appears_whole_once_and_a_failed_one_leaves_nothing(tmp_path):
  folder = tmp_path / "sets" / "mini"
  calls = []

  def write(tmp):
    calls.append(tmp)
    (tmp / "part-0").write_text("rows")
    return {"rows": 1}

  data.write_dataset(folder, write)
  data.write_dataset(folder, write)  # Already complete: not written again.
  assert len(calls) == 1 and data.is_generated(folder)
  assert (folder / "part-0").read_text() == "rows"
  assert sorted(p.name for p in folder.parent.iterdir()) == ["mini"]

  def fail(tmp):
    (tmp / "part-0").write_text("half")
    raise RuntimeError("interrupted")

  other = tmp_path / "sets" / "other"
  with pytest.raises(RuntimeError):
    data.write_dataset(other, fail)
  assert sorted(p.name for p in other.parent.iterdir()) == ["mini"]
