"""Benchmark: `sunk local up` on a warm machine, to a usable Slurm, and `down`.

    sudo .venv/bin/python bench/local_up.py

Runs `sunk local up` in a fresh state directory (the caches in ~/.cache/sunk
already built: run `sunk testbed prepare` first), then as the cluster's user
over ssh: `sinfo`, `sbatch` to completion with `sacct`, `srun -N3 hostname`;
then `sunk local down` and a check that no process of the bed is left.
Prints the stage lines `up` logs and each figure.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sunk_testbed.bed import Bed


def sunk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sunk", *args], capture_output=True, text=True, check=False
    )


def rooted_in(state: Path) -> list[str]:
    """Processes whose command line names the state directory (what `down` must stop)."""
    out = subprocess.run(["pgrep", "-af", str(state)], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    state = Path(tempfile.mkdtemp(prefix="sunk-up-", dir="/tmp"))
    bed = Bed(state)
    try:
        t0 = time.monotonic()
        up = sunk("local", "up", "--state", str(state))
        up_s = time.monotonic() - t0
        sys.stderr.write(up.stderr)
        if up.returncode != 0:
            raise SystemExit(f"sunk local up failed ({up.returncode})")
        login = bed.login_address()
        key = bed.ssh_key()

        def ssh(command: str) -> tuple[str, float]:
            t = time.monotonic()
            proc = bed.ssh(key, login, [command], timeout=120)
            if proc.returncode != 0:
                raise SystemExit(f"{command!r}: {proc.stderr}")
            return proc.stdout, time.monotonic() - t

        sinfo, sinfo_s = ssh("sinfo -h -N -o '%N %t'")
        submitted, _ = ssh("cd && sbatch --parsable --wrap hostname")
        job = submitted.strip().split(";")[0]
        t = time.monotonic()
        sacct = [f"sacct -n -X -j {job} -o State"]
        while "COMPLETED" not in bed.ssh(key, login, sacct, timeout=60).stdout:
            if time.monotonic() - t > 120:
                raise SystemExit(f"job {job} did not complete")
            time.sleep(0.5)
        job_s = time.monotonic() - t
        names, srun_s = ssh("srun -N3 hostname")
        t = time.monotonic()
        down = sunk("local", "down", "--state", str(state))
        down_s = time.monotonic() - t
        if down.returncode != 0:
            raise SystemExit(f"sunk local down failed: {down.stderr}")
        left = rooted_in(state)
        print("sunk local up (warm caches), 2 cores shared with other work:")
        for line in up.stderr.splitlines():
            if re.search(r"ready in|Ready in|installed in|up in|idle in|sacct in", line):
                print(f"  {line.strip()}")
        print(f"  up, command to usable Slurm       {up_s:6.1f} s")
        print(f"  sinfo over ssh                    {sinfo_s:6.1f} s: {' '.join(sinfo.split())}")
        print(f"  sbatch -> COMPLETED in sacct      {job_s:6.1f} s")
        hosts = " ".join(sorted(names.split()))
        print(f"  srun -N3 hostname                 {srun_s:6.1f} s: {hosts}")
        print(f"  down                              {down_s:6.1f} s, processes left: {len(left)}")
    finally:
        bed.down()  # a no-op after a clean `down`
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
