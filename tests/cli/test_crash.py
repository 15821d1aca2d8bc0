"""An exception nobody expected: a short traceback of the code at fault, the version, how to
see everything, and its own exit code."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from mlbench import __version__

# A real third-party plugin whose module fails while JAX traces it: the traceback passes
# through click, mlbench, importlib's entry-point loading and JAX's tracing machinery.
PLUGIN = """
    import jax


    def _check(x):
      raise RuntimeError("the plugin's table has no row for this shape")


    def _build():
      return jax.jit(_check)(1.0)


    WORKLOAD = _build()
    """


def _describe_boom(tmp_path, **env):
  (tmp_path / "boom_plugin.py").write_text(textwrap.dedent(PLUGIN))
  info = tmp_path / "boom_plugin-0.1.dist-info"
  info.mkdir(exist_ok=True)
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: boom-plugin\nVersion: 0.1\n")
  (info / "entry_points.txt").write_text("[mlbench.workloads]\nboom = boom_plugin:WORKLOAD\n")
  env = {**{k: v for k, v in os.environ.items() if k != "MLBENCH_DEBUG"},
         "PYTHONPATH": str(tmp_path), **env}
  return subprocess.run([sys.executable, "-c", "import sys; from mlbench.cli import main; "
                         "sys.exit(main())", "describe", "boom"], capture_output=True, text=True,
                        env=env, timeout=300)


def test_a_crash_shows_only_the_frames_to_fix_and_how_to_see_all(tmp_path):
  out = _describe_boom(tmp_path)
  err = out.stderr
  assert out.returncode == 70, err
  assert err.startswith(f"error: unexpected RuntimeError (mlbench {__version__}, a bug: "
                        "please report it)\n"), err
  assert 'boom_plugin.py", line 6, in _check' in err and "mlbench/registry.py" in err
  assert "RuntimeError: the plugin's table has no row for this shape" in err
  for library in ("/jax/", "/click/", "importlib", "<frozen", "For simplicity, JAX"):
    assert library not in err, library
  assert "frames of libraries left out" in err
  assert err.rstrip().endswith("run the same command again with MLBENCH_DEBUG=1")
  assert out.stdout == ""


def test_mlbench_debug_shows_the_whole_traceback(tmp_path):
  out = _describe_boom(tmp_path, MLBENCH_DEBUG="1")
  assert out.returncode == 70
  assert "Traceback (most recent call last)" in out.stderr and "/click/" in out.stderr
  assert "/jax/" in out.stderr and out.stderr.rstrip().endswith(f"mlbench {__version__}")
