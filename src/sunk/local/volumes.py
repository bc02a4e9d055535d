"""Pod volumes on the host: directories the containers get bind-mounted.

ConfigMap, Secret, downwardAPI and projected volumes are written the way
kubelet's atomic writer does: the files live in a timestamped directory,
`..data` points at it, and each top-level name is a relative symlink through
`..data`. An update writes a new directory and swaps `..data` with one
rename, so a container sees either the old or the new set, never a mix, and
updates reach containers that mount the whole volume (not those that mount a
single key with subPath: the bind pins the file, exactly as in Kubernetes).
"""

from __future__ import annotations

import datetime
import os
import shutil
import stat
from pathlib import Path, PurePosixPath

from sunk.local.plan import ConfigError, FileMap

DATA = "..data"


def write_atomic(directory: Path, files: FileMap, group: int | None = None) -> None:
    """Make `directory` hold exactly `files` (see module docstring)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o755)  # noqa: S103 - containers of any user read volumes
    stamp = datetime.datetime.now(datetime.UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
    version = directory / stamp
    version.mkdir(mode=0o755)
    for rel, (content, mode) in files.items():
        path = version / rel
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        path.write_bytes(content)
        os.chmod(path, mode)
        if group is not None:
            os.chown(path, -1, group)
    if group is not None:
        os.chown(version, -1, group)
    tmp = directory / "..data_tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(stamp)
    old = os.readlink(directory / DATA) if (directory / DATA).is_symlink() else None
    os.replace(tmp, directory / DATA)
    tops = {PurePosixPath(rel).parts[0] for rel in files}
    for top in tops:
        link = directory / top
        if not link.is_symlink():
            link.symlink_to(f"{DATA}/{top}")
    for entry in directory.iterdir():
        if entry.name.startswith(".."):
            continue
        if entry.name not in tops and entry.is_symlink():
            entry.unlink()
    if old and old != stamp:
        shutil.rmtree(directory / old, ignore_errors=True)


def empty_dir(path: Path, group: int | None = None) -> Path:
    """An emptyDir volume: world-writable like Kubernetes makes it (0777), once; the
    containers may change its mode and owner afterwards."""
    if path.is_dir():
        return path
    path.mkdir(parents=True)
    os.chmod(path, 0o777)  # noqa: S103 - emptyDir semantics
    if group is not None:
        os.chown(path, -1, group)
        os.chmod(path, 0o2777)  # noqa: S103 - emptyDir semantics
    return path


_HOST_PATH_CHECKS = {
    "Directory": stat.S_ISDIR,
    "File": stat.S_ISREG,
    "Socket": stat.S_ISSOCK,
    "CharDevice": stat.S_ISCHR,
    "BlockDevice": stat.S_ISBLK,
}


def host_path(path: str, kind: str | None) -> Path:
    """A hostPath volume: the path on this machine (every local node shares it)."""
    target = Path(path)
    kind = kind or ""
    if kind == "DirectoryOrCreate":
        if not target.exists():
            target.mkdir(parents=True, mode=0o755)
        kind = "Directory"
    elif kind == "FileOrCreate":
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch(mode=0o644)
        kind = "File"
    if kind in _HOST_PATH_CHECKS:
        try:
            mode = target.stat().st_mode
        except FileNotFoundError:
            raise ConfigError(f"hostPath {path} does not exist", reason="FailedMount") from None
        if not _HOST_PATH_CHECKS[kind](mode):
            raise ConfigError(f"hostPath {path} is not a {kind}", reason="FailedMount")
    elif not target.exists():
        # Unset type: no checks in Kubernetes; the bind needs something there.
        target.mkdir(parents=True, mode=0o755)
    return target


def write_file_in_place(path: Path, text: str) -> bool:
    """Rewrite a bind-mounted file through its inode (a rename would not reach mounts)."""
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    with path.open("a+") as handle:
        handle.seek(0)
        handle.truncate()
        handle.write(text)
    os.chmod(path, 0o644)
    return True
