"""mlbench: an MLPerf-style time-to-quality benchmark harness.

Importing this package only defines names; device, flag and distributed setup
happen in `mlbench.train.runtime.setup()`, which the CLI calls.
"""

__version__ = "0.1.0"
