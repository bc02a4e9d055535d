"""container-fetch's checks of the container cache (images/slurm/containers/container-fetch).

The fetcher runs as root for every container step and writes below the cache
it is given: it must refuse a cache, or a directory below it, that anyone but
root could have changed (a symlink anywhere in the path, an owner other than
root, group or other write), before it writes anything. The real script is run
here; the refusals come before it asks a registry for anything. The SPANK
plugin's own checks, and the attacks themselves, run on the README's cluster
(tests/charts/test_local_up_containers_cache.py).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

FETCHER = Path(__file__).parents[2] / "images" / "slurm" / "containers" / "container-fetch"
# Nothing answers here: a fetch that gets past the checks fails at the registry.
IMAGE = "127.0.0.1:9/sunk/none:1"
USER = 2000


def _root_only(path: Path) -> bool:
    info = path.lstat()
    return stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o022


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory whose every ancestor is root's alone (not under /tmp, which
    anyone may write): where a valid cache can be."""
    if os.geteuid() != 0:
        pytest.skip("the cache's owner must be root: run as root")
    home = Path.home().resolve()
    if not all(_root_only(p) for p in (home, *home.parents)):
        pytest.skip(f"{home} or one of its parents is not root's alone")
    made = Path(tempfile.mkdtemp(prefix="sunk-fetch-test-", dir=home))
    try:
        yield made
    finally:
        shutil.rmtree(made)


def fetch(cache: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(FETCHER), str(cache), IMAGE],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )


def refused(proc: subprocess.CompletedProcess[str]) -> bool:
    return proc.returncode != 0 and "refusing to fetch" in proc.stderr


def cache_in(base: Path, mode: int = 0o700) -> Path:
    cache = base / "cache"
    cache.mkdir()
    cache.chmod(mode)
    return cache


def test_a_root_only_cache_passes_and_what_is_made_in_it_is_root_only(base: Path) -> None:
    cache = cache_in(base)
    proc = fetch(cache)
    assert not refused(proc), proc.stderr
    for made in ("images", "tmp"):
        info = (cache / made).lstat()
        assert stat.S_ISDIR(info.st_mode), made
        assert info.st_uid == 0, made
        assert stat.S_IMODE(info.st_mode) == 0o700, made


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o702])
def test_a_cache_others_may_write_is_refused(base: Path, mode: int) -> None:
    cache = cache_in(base, mode)
    proc = fetch(cache)
    assert refused(proc), proc.stderr
    assert "writable by root alone" in proc.stderr
    assert list(cache.iterdir()) == []


def test_a_cache_of_another_owner_is_refused(base: Path) -> None:
    cache = cache_in(base)
    os.chown(cache, USER, USER)
    proc = fetch(cache)
    assert refused(proc), proc.stderr
    assert f"uid {USER}" in proc.stderr
    assert list(cache.iterdir()) == []


def test_a_symlink_anywhere_in_the_path_is_refused(base: Path) -> None:
    real = cache_in(base)
    (base / "link").symlink_to(real)
    assert refused(proc := fetch(base / "link")), proc.stderr
    (base / "parent").symlink_to(base)
    assert refused(proc := fetch(base / "parent" / "cache")), proc.stderr
    assert "symbolic link" in proc.stderr
    assert list(real.iterdir()) == []


@pytest.mark.parametrize("name", ["images", "tmp"])
def test_a_planted_directory_below_the_cache_is_refused(base: Path, name: str) -> None:
    """What a user could have left while the cache was writable: a link to
    elsewhere, or a directory of their own. Nothing is written through either."""
    cache = cache_in(base)
    elsewhere = base / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (cache / name).symlink_to(elsewhere)
    assert refused(proc := fetch(cache)), proc.stderr
    assert list(elsewhere.iterdir()) == []
    (cache / name).unlink()
    (cache / name).mkdir(mode=0o700)
    os.chown(cache / name, USER, USER)
    assert refused(proc := fetch(cache)), proc.stderr
    assert list((cache / name).iterdir()) == []


@pytest.mark.parametrize("cache", ["relative/cache", "/var/../var/lib/sunk-containers"])
def test_a_cache_path_with_relative_parts_is_refused(cache: str) -> None:
    assert refused(proc := fetch(cache)), proc.stderr
