"""The `mlbench` command line: a thin layer over the library.

Commands parse and validate their options, then call one library function.
JAX, Flax and TensorFlow are imported inside command bodies only, so
`mlbench --help` answers at once. Human output goes to stderr (rich); machine
output (one JSON line per run) goes to stdout. Bad input ends with a one-line
`error: ...` and exit code 2, never a traceback; a run whose storage fails (a full disk,
a refused write) with one `error: ...` line naming the cause and the `--resume` that
continues it, exit code 75; an unexpected exception with a short traceback without
library frames and exit code 70 (`mlbench.cli.crash`).
"""

from __future__ import annotations

import importlib

import click

from mlbench import __version__
from mlbench.cli import crash
from mlbench.errors import Interrupted, StorageFailed, UserError
from mlbench.train import runtime

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
# Each command's module, imported when the command is asked for: `mlbench validate` need
# not import what `run` and `check` need (numpy, the config tree; a quarter second).
COMMANDS = {"list": "info:list_cmd", "describe": "info:describe_cmd", "run": "run:run_cmd",
            "check": "check:check_cmd", "plan": "plan:plan_cmd",
            "validate": "validate:validate_cmd", "compare": "compare:compare_cmd",
            "data": "data:data_group"}


class _Commands(click.Group):
  def list_commands(self, ctx: click.Context) -> list[str]:
    return sorted(COMMANDS)

  def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
    if name not in COMMANDS:
      return None
    module, attr = COMMANDS[name].split(":")
    return getattr(importlib.import_module(f"mlbench.cli.{module}"), attr)


@click.group(cls=_Commands, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="mlbench")
def cli() -> None:
  """MLPerf-style time-to-quality benchmarks on TPU pods, GPU clusters and CPUs.

  `mlbench run resnet50` trains the ResNet-50 mini config to its quality target
  and writes an MLPerf result log under results/.
  """



def _fail(message: str, code: int = 2) -> int:
  click.echo(f"error: {message}", err=True)
  return code


def main(argv: list[str] | None = None) -> int:
  """Entry point of the `mlbench` console script; returns the exit code (of every process
  of a multi-process run alike: `runtime.leave`)."""
  crash.debugging()  # before anything imports JAX
  runtime.cpu_only_without_accelerator()  # no libtpu noise on a CPU machine, any command
  try:
    result = cli.main(args=argv, prog_name="mlbench", standalone_mode=False)
  except (Exception, KeyboardInterrupt, Interrupted) as e:
    return runtime.leave(_failed(e), finished=False)
  return runtime.leave(result if isinstance(result, int) else 0, finished=True)


def _failed(e: BaseException) -> int:
  """Says what stopped the command, in one line where it is no bug; its exit code."""
  if isinstance(e, UserError):
    return _fail(str(e))
  if isinstance(e, Interrupted):  # A stop by signal: say what was kept; exit 128 + signal.
    click.echo(e.message, err=True)
    return 128 + e.signum
  if isinstance(e, StorageFailed):  # A write the run needs failed: the cause, what was kept,
    click.echo(f"error: {e.message}", err=True)  # the --resume.
    return e.EXIT_CODE
  if isinstance(e, click.exceptions.NoSuchOption):
    hint = f"; did you mean {', '.join(e.possibilities)}?" if e.possibilities else ""
    return _fail(f"no such option {e.option_name}{hint} (see `mlbench {e.ctx.info_name} --help`)"
                 if e.ctx else e.format_message())
  if isinstance(e, click.ClickException):
    cmd = f" {e.ctx.info_name}" if getattr(e, "ctx", None) and e.ctx.parent else ""
    return _fail(f"{e.format_message()} (see `mlbench{cmd} --help`)")
  if isinstance(e, click.exceptions.Abort):
    return _fail("aborted", 130)
  if isinstance(e, KeyboardInterrupt):
    return _fail("interrupted", 130)
  return crash.handle(e)  # The last resort: a bug, reported short (MLBENCH_DEBUG=1: in full).
