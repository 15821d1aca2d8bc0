"""A real one-node SLURM on 127.0.0.1 for the launch tests (not collected): munged, slurmctld
and slurmd of Debian's slurm-wlm (`apt-get install slurm-wlm`; `.ci/run` installs it), each
on its own socket, ports and files under one folder, so nothing of the machine's own SLURM or
munge is touched. Commands reach it through `env` (SLURM_CONF). Starting needs root (slurmd
runs jobs as any user) and the munge key the package made.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("srun", "sbatch", "scancel", "sinfo", "squeue")
KEY = Path("/etc/munge/munge.key")


def missing() -> str | None:
  """Why a cluster cannot start here (None: it can)."""
  absent = [c for c in (*DAEMONS, *COMMANDS) if shutil.which(c) is None
            and not os.path.exists(f"/usr/sbin/{c}")]
  if absent:
    return f"SLURM is not installed ({', '.join(absent)} missing; apt-get install slurm-wlm)"
  if os.geteuid() != 0:
    return "a local SLURM needs root (slurmd)"
  if not KEY.exists():
    return f"no munge key at {KEY}"
  return None


def free_port(low: int = 0, high: int = 0) -> int:
  """A TCP port on 127.0.0.1 that nothing listens on (any, or one in [low, high))."""
  for port in [0] if not low else random.sample(range(low, high), 200):
    with socket.socket() as s:
      try:
        s.bind(("127.0.0.1", port))
      except OSError:
        continue
      return s.getsockname()[1]
  raise RuntimeError(f"no free port in [{low}, {high})")


def _which(name: str) -> str:
  return shutil.which(name) or f"/usr/sbin/{name}"


class LocalSlurm:
  """munged, slurmctld and slurmd for one node, `localhost` at 127.0.0.1, with `cpus` CPUs.

  Args:
    ports: (slurmctld's, slurmd's) TCP ports on 127.0.0.1 (default: free ones).
  """

  def __init__(self, ports: tuple[int, int] | None = None, cpus: int | None = None):
    # Under /tmp itself: munged runs as the munge user, who cannot enter pytest's folders.
    self.folder = Path(tempfile.mkdtemp(prefix="mlbench-slurm-"))
    self.folder.chmod(0o755)
    self.conf = self.folder / "slurm.conf"
    self.env = {"SLURM_CONF": str(self.conf)}
    self._ports = ports or (free_port(), free_port())
    self._cpus = cpus or os.cpu_count() or 1
    self._daemons: list[subprocess.Popen] = []

  def start(self, timeout_s: float = 60) -> LocalSlurm:
    """Starts the daemons and waits for the node to be idle; raises RuntimeError with their
    logs where it is not within `timeout_s`."""
    munge = self.folder / "munge"
    munge.mkdir()
    munge.chmod(0o755)  # munged wants its socket's folder searchable by all
    shutil.chown(munge, "munge", "munge")
    sock = munge / "munge.socket"
    self._spawn(["runuser", "-u", "munge", "--", _which("munged"), "--foreground",
                 f"--socket={sock}", f"--key-file={KEY}", f"--pid-file={munge}/munged.pid",
                 f"--log-file={munge}/munged.log", f"--seed-file={munge}/munged.seed"])
    self._wait(lambda: sock.exists(), timeout_s, "munged did not open its socket")
    for d in ("state", "spool"):
      (self.folder / d).mkdir()
    self.conf.write_text(self._config(sock))
    self._spawn([_which("slurmctld"), "-D", "-f", str(self.conf)])
    self._spawn([_which("slurmd"), "-D", "-N", "localhost", "-f", str(self.conf)])
    self._wait(lambda: self.run("sinfo", "-h", "-o", "%t").stdout.strip() == "idle",
               timeout_s, "the node did not become idle")
    return self

  def _config(self, sock: Path) -> str:
    f = self.folder
    return "\n".join([
        "ClusterName=mlbench", "SlurmctldHost=localhost(127.0.0.1)",
        # jax.distributed's coordinator port on SLURM is 61440 + job id % 4096: the first
        # job's is a free one.
        f"FirstJobId={free_port(61440, 65536) - 61440 + 4096}",
        f"SlurmctldPort={self._ports[0]}", f"SlurmdPort={self._ports[1]}",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge",
        f"AuthInfo=socket={sock}", "CredType=cred/munge", f"StateSaveLocation={f}/state",
        f"SlurmdSpoolDir={f}/spool", f"SlurmctldPidFile={f}/slurmctld.pid",
        f"SlurmdPidFile={f}/slurmd.pid", f"SlurmctldLogFile={f}/slurmctld.log",
        f"SlurmdLogFile={f}/slurmd.log", "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU", "SlurmdParameters=config_overrides",
        "ReturnToService=2", "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "KillWait=30",
        f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={self._cpus} RealMemory=1000 "
        "State=UNKNOWN",
        "PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP", ""])

  def _spawn(self, argv: list[str]) -> None:
    log = open(self.folder / f"{Path(argv[0] if argv[0] != 'runuser' else argv[4]).name}.out",
               "w")
    self._daemons.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
    log.close()

  def _wait(self, ready, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
      dead = [p.args[0] for p in self._daemons if p.poll() is not None]
      if dead or time.monotonic() > deadline:
        raise RuntimeError(f"{what} ({', '.join(dead) or 'timed out'}):\n{self.logs()}")
      time.sleep(0.2)

  def logs(self) -> str:
    """The end of every daemon's log."""
    out = []
    for log in sorted(self.folder.rglob("*.log")) + sorted(self.folder.glob("*.out")):
      out.append(f"== {log.name}\n" + log.read_text(errors="replace")[-2000:])
    return "\n".join(out)

  def run(self, *argv: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """A SLURM command against this cluster (sinfo, scancel, ...), to its end."""
    env = {**os.environ, **self.env, **kwargs.pop("env", {})}
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                          **kwargs)

  def stop(self) -> None:
    """Ends the daemons (by their pids) and removes the folder."""
    for p in reversed(self._daemons):
      if p.poll() is None:
        p.terminate()
        try:
          p.wait(15)
        except subprocess.TimeoutExpired:
          p.kill()
          p.wait()
    shutil.rmtree(self.folder, ignore_errors=True)
