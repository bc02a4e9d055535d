#!/usr/bin/env python3
"""The real-GPU check (docs/gpus.md): sunk's own inventory, CDI and NVML code
on a machine with NVIDIA's driver, as root, from the repository's root:

    python3 scripts/gpu-check-real-node.py [--dev DIR --root DIR] [OUT_FILE]

(`--dev` and `--root`: where the device nodes and the driver's files are,
for a dry run on stand-ins: testbed/gpu-stand-in.)

1. `sunk.gpus.inventory` lists the node's NVIDIA device nodes, driver
   libraries and tools and makes the CDI spec nvidia-ctk would; the spec is
   written as JSON and read back by `sunk.gpus.cdi` unchanged.
2. The edits a slurmd pod (`nvidia.com/gpu=all`), a 1-GPU pod
   (`nvidia.com/gpu=0`) and a CPU-only pod (none) would get are resolved
   from it; each is applied to a fresh root in a mount namespace of its own,
   as a container runtime applies them: the node's /usr, /bin, /lib and
   /opt read-only with every driver library and tool masked, an empty /dev
   and /etc, then the edits' device nodes and mounts, and the linker cache
   made over the libraries' folders (what NVIDIA's update-ldcache hook does).
   In that root: the device nodes and driver libraries present,
   `nvidia-smi -L`, and the CUDA driver's cuInit and cuDeviceGetCount
   through ctypes.
3. `sunk.gpus.nvml` asks NVML (nvidia-ml-py) for the GPUs and prints the
   gres.conf lines Slurm's AutoDetect=nvml would find.

Everything printed goes to OUT_FILE as well. Exits 1 when a check fails.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from sunk.gpus import cdi, inventory, nvml
from sunk.gpus.nvml import MigDevice, NvmlGpu

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
BASE = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt")
ETC = ("passwd", "group", "nsswitch.conf", "hosts", "ld.so.conf")

PROBE = r"""
import ctypes, glob, os
dirs = %(dirs)r
print("  /dev:", " ".join(sorted(os.listdir("/dev"))))
if os.path.isdir("/dev/nvidia-caps"):
    print("  /dev/nvidia-caps:", " ".join(sorted(os.listdir("/dev/nvidia-caps"))))
names = ("/libcuda.so*", "/libnvidia-ml.so*")
paths = [p for d in dirs for n in names for p in glob.glob(d + n)]
found = sorted({p for p in paths if os.path.isfile(p) and os.path.getsize(p)})
print("  driver libraries readable:", " ".join(found) or "none")
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    print("  libcuda.so.1: not loadable:", exc)
else:
    rc = cuda.cuInit(0)
    count = ctypes.c_int(-1)
    rc2 = cuda.cuDeviceGetCount(ctypes.byref(count))
    names = []
    for i in range(max(count.value, 0)):
        dev = ctypes.c_int()
        name = ctypes.create_string_buffer(100)
        cuda.cuDeviceGet(ctypes.byref(dev), i)
        cuda.cuDeviceGetName(name, 100, dev)
        names.append(name.value.decode())
    print(f"  cuInit(0) = {rc}; cuDeviceGetCount = {rc2}, {count.value} device(s): {names}")
"""

lines: list[str] = []
failures: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    lines.append(text)


def check(ok: bool, what: str) -> None:
    say(f"  [{'ok' if ok else 'FAILED'}] {what}")
    if not ok:
        failures.append(what)


def run(argv: list[str], timeout: float = 60, env: dict[str, str] | None = None) -> str:
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]}: {exc}"
    return (proc.stdout + proc.stderr).rstrip() + (
        "" if proc.returncode == 0 else f" (rc {proc.returncode})"
    )


# ------------------------------------------------------------- inside a root

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]


def mount(source: str | None, target: str | Path, fstype: str | None, flags: int) -> None:
    args = (
        source.encode() if source else None,
        str(target).encode(),
        fstype.encode() if fstype else None,
        flags,
        None,
    )
    if _libc.mount(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(
            errno, f"mount {source} on {target} ({fstype}, {flags:#x}): {os.strerror(errno)}"
        )


def bind(source: str | Path, target: Path, read_only: bool = True, recursive: bool = False) -> None:
    mount(str(source), target, None, MS_BIND | (MS_REC if recursive else 0))
    if read_only:
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def place(target: Path, like: Path) -> None:
    """An empty file or folder at `target` to mount `like` on."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if like.is_dir():
        target.mkdir(exist_ok=True)
    elif not target.exists():
        target.touch()


def inside(name: str, edits_json: str) -> None:
    """In a new mount namespace: build the root, apply the edits, probe."""
    edits = cdi.parse_spec(edits_json, "edits").edits
    if _libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    root = Path(tempfile.mkdtemp(prefix=f"cdi-{name}-"))
    mount("tmpfs", root, "tmpfs", 0)
    for entry in BASE:
        host = Path("/") / entry
        if host.is_symlink():
            os.symlink(os.readlink(host), root / entry)
        elif host.is_dir():
            (root / entry).mkdir()
            bind(host, root / entry, recursive=True)
    # Every driver library and tool of the node masked, whatever its folder:
    # only the edits' mounts may bring one back.
    empty = root / ".empty"
    empty.touch()
    masked = []
    if (root / "usr/local/nvidia").is_dir():
        mount("tmpfs", root / "usr/local/nvidia", "tmpfs", 0)
        masked.append("/usr/local/nvidia/*")
    for folder in (*inventory.LIBRARY_DIRS, *inventory.BINARY_DIRS):
        here = root / folder.lstrip("/")
        if not here.is_dir() or folder.startswith("/usr/local/nvidia"):
            continue
        for entry in sorted(os.listdir(here)):
            lib = inventory.LIBRARY_FILE.fullmatch(entry) or entry.startswith(
                ("libcuda.so", "libnvidia-")
            )
            if lib or entry in inventory.BINARIES:
                target = here / entry
                if target.is_file() and not target.is_symlink():
                    bind(empty, target)
                    masked.append(f"{folder}/{entry}")
    print(f"  masked from the node: {' '.join(masked) or 'nothing'}")
    for folder in ("dev", "etc", "tmp", "proc", "sys"):
        (root / folder).mkdir()
    mount("tmpfs", root / "dev", "tmpfs", 0)
    for node in ("null", "zero", "urandom", "random"):
        place(root / "dev" / node, Path("/dev") / node)
        bind(Path("/dev") / node, root / "dev" / node, read_only=False)
    (root / "dev/shm").mkdir()
    mount("tmpfs", root / "dev/shm", "tmpfs", 0)
    mount("tmpfs", root / "etc", "tmpfs", 0)
    mount("tmpfs", root / "tmp", "tmpfs", 0)
    for entry in ETC:
        if Path("/etc", entry).is_file():
            shutil.copy(Path("/etc", entry), root / "etc" / entry)
    if Path("/etc/ld.so.conf.d").is_dir():
        shutil.copytree("/etc/ld.so.conf.d", root / "etc/ld.so.conf.d")
    try:
        mount("proc", root / "proc", "proc", 0)
    except OSError:
        bind("/proc", root / "proc", read_only=False, recursive=True)
    bind("/sys", root / "sys", read_only=False, recursive=True)
    # The edits, as a runtime applies them.
    for node in edits.device_nodes:
        target = root / node.path.lstrip("/")
        place(target, Path(node.source))
        bind(node.source, target, read_only=False)
    for m in edits.mounts:
        target = root / m.container_path.lstrip("/")
        place(target, Path(m.host_path))
        bind(m.host_path, target, read_only="ro" in m.options)
    folders = inventory.library_folders(edits)
    if folders:  # NVIDIA's update-ldcache hook
        conf = root / "etc/ld.so.conf.d"
        conf.mkdir(exist_ok=True)
        (conf / "000-cdi.conf").write_text("".join(f"{f}\n" for f in folders))
    os.chroot(root)
    os.chdir("/")
    env = {"PATH": "/usr/local/nvidia/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": "/"}
    for assignment in edits.env:
        key, value = assignment.split("=", 1)
        env[key] = value
    ldconfig = next((p for p in ("/usr/sbin/ldconfig", "/sbin/ldconfig") if Path(p).exists()), "")
    print(f"  ldconfig over {folders}: {run([ldconfig], env=env) or 'done'}")
    smi = next(
        (
            p
            for p in ("/usr/local/nvidia/bin/nvidia-smi", "/usr/bin/nvidia-smi")
            if Path(p).exists() and Path(p).stat().st_size
        ),
        "",
    )
    print(f"  nvidia-smi -L: {run([smi, '-L'], env=env) if smi else 'no nvidia-smi here'}")
    dirs = sorted({*inventory.LIBRARY_DIRS, *folders})
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    print(run([python, "-c", PROBE % {"dirs": dirs}], env=env))


def in_a_root(name: str, edits: cdi.ContainerEdits) -> str:
    """The probe's output in a root with `edits` applied (a child process)."""
    holder = cdi.Spec(
        version=inventory.CDI_VERSION,
        kind="sunk.dev/check",
        devices=(cdi.Device("x", cdi.ContainerEdits(env=("X=1",))),),
        edits=edits,
    )
    return run([sys.executable, __file__, "--inside", name, cdi.spec_json(holder)], timeout=120)


# ------------------------------------------------------------------- NVML


def nvml_text(value: bytes | str) -> str:
    """A string NVML returns: bytes from older nvidia-ml-py, str from newer."""
    return value.decode() if isinstance(value, bytes) else str(value)


def read_migs(lib: Any, handle: Any) -> tuple[MigDevice, ...]:
    """A GPU's MIG devices, by MIG index as Slurm counts them (up to the
    first index without one); none where the bindings predate MIG."""
    needed = (
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId",
        "nvmlDeviceGetAttributes",
    )
    if not all(hasattr(lib, name) for name in needed):
        say("  this nvidia-ml-py predates MIG: MIG devices not listed")
        return ()
    migs = []
    for mig_index in range(lib.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)
        except lib.NVMLError as exc:
            if exc.value == lib.NVML_ERROR_NOT_FOUND:
                break
            raise
        attributes = lib.nvmlDeviceGetAttributes(mig)
        uuid = lib.nvmlDeviceGetUUID(mig)
        migs.append(
            MigDevice(
                gpu_instance_id=lib.nvmlDeviceGetGpuInstanceId(mig),
                compute_instance_id=lib.nvmlDeviceGetComputeInstanceId(mig),
                slice_count=attributes.gpuInstanceSliceCount,
                memory_mib=attributes.memorySizeMB,
                uuid=nvml_text(uuid),
            )
        )
    return tuple(migs)


def read_nvml() -> list[NvmlGpu]:
    """The node's GPUs from NVML. Raises ImportError without nvidia-ml-py and
    the library's NVMLError without a driver."""
    import pynvml as lib  # nvidia-ml-py, NVIDIA's bindings

    lib.nvmlInit()
    try:
        cpu_count = os.cpu_count() or 1
        words = (cpu_count + 63) // 64
        found = []
        for index in range(lib.nvmlDeviceGetCount()):
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            name = lib.nvmlDeviceGetName(handle)
            uuid = lib.nvmlDeviceGetUUID(handle)
            mask = lib.nvmlDeviceGetCpuAffinity(handle, words)
            cpus = tuple(
                word * 64 + bit
                for word, bits in enumerate(mask)
                for bit in range(64)
                if bits >> bit & 1
            )
            try:
                mig = lib.nvmlDeviceGetMigMode(handle)[0] == lib.NVML_DEVICE_MIG_ENABLE
            except lib.NVMLError:
                mig = False  # a GPU without MIG
            found.append(
                NvmlGpu(
                    index=index,
                    minor=lib.nvmlDeviceGetMinorNumber(handle),
                    name=nvml_text(name),
                    uuid=nvml_text(uuid),
                    cpus=cpus,
                    mig=mig,
                    migs=read_migs(lib, handle) if mig else (),
                )
            )
        return found
    finally:
        lib.nvmlShutdown()


# ------------------------------------------------------------------ the check


def main(argv: list[str]) -> None:
    dev, root = Path("/dev"), "/"
    while argv[:1] in (["--dev"], ["--root"]):
        if argv[0] == "--dev":
            dev = Path(argv[1])
        else:
            root = argv[1]
        argv = argv[2:]
    out_file = Path(argv[0]) if argv else None
    started = time.monotonic()
    say(f"host: {run(['uname', '-srm'])}")
    driver = Path("/proc/driver/nvidia/version")
    version = driver.read_text().splitlines()[0] if driver.exists() else f"no {driver}"
    say(f"driver: {version}")
    say(f"host nvidia-smi -L: {run(['nvidia-smi', '-L'])}")

    say("\n1. inventory (sunk.gpus.inventory.find_nvidia)")
    node = inventory.find_nvidia(dev=dev, root=Path(root))
    say(f"  GPUs: {node.gpus}")
    say(f"  control nodes: {node.control}")
    say(f"  libraries ({len(node.libraries)}): {' '.join(node.libraries)}")
    say(f"  tools: {node.binaries}; NVIDIA's CDI hook: {node.hook}")
    check(bool(node.gpus), "at least one GPU device node")
    check(any("libcuda.so" in p for p in node.libraries), "libcuda found")
    spec = inventory.nvidia_spec(node)
    text = cdi.spec_json(spec)
    check(
        cdi.parse_spec(text, "generated") == spec, "the spec written as JSON reads back unchanged"
    )
    common = spec.edits
    say(
        f"  spec: kind {spec.kind}, devices {[d.name for d in spec.devices]}, common:"
        f" {len(common.device_nodes)} device nodes, {len(common.mounts)} mounts,"
        f" {len(common.hooks)} hooks"
    )
    if out_file:
        out_file.with_suffix(".cdi.json").write_text(text)

    say("\n2. each pod's edits, applied in a root of its own")
    cases = {
        "slurmd pod (nvidia.com/gpu=all)": spec.resolve([spec.qualified("all")])
        if node.gpus
        else cdi.ContainerEdits(),
        "1-GPU pod (nvidia.com/gpu=0)": spec.resolve([spec.qualified(str(node.gpus[0][0]))])
        if node.gpus
        else cdi.ContainerEdits(),
        "CPU-only pod (no CDI device)": cdi.ContainerEdits(),
    }
    outputs = {}
    for name, edits in cases.items():
        nodes = [n.path for n in edits.device_nodes]
        say(f"- {name}: device nodes {nodes}, {len(edits.mounts)} mounts")
        out = in_a_root(name.split()[0], edits)
        outputs[name] = out
        for line in out.splitlines():
            say(line)
    pod = outputs["1-GPU pod (nvidia.com/gpu=0)"]
    cpu = outputs["CPU-only pod (no CDI device)"]
    check("cuInit(0) = 0" in pod and "1 device(s)" in pod, "the 1-GPU pod's CUDA sees one GPU")
    check("GPU 0" in pod, "nvidia-smi -L lists GPU 0 in the 1-GPU pod")
    check(
        "not loadable" in cpu and "no nvidia-smi" in cpu,
        "the CPU-only pod has no libcuda and no nvidia-smi",
    )
    check(
        "nvidia0" not in cpu.split("/dev:", 1)[-1].splitlines()[0],
        "the CPU-only pod has no GPU device node",
    )

    say("\n3. NVML (sunk.gpus.nvml, nvidia-ml-py)")
    try:
        gpus = read_nvml()
    except Exception as exc:  # printed, then a failed check
        say(f"  NVML: {type(exc).__name__}: {exc}")
        gpus = []
    for gpu in gpus:
        mig = "on" if gpu.mig else "off"
        say(f"  {gpu.index}: {gpu.name} {gpu.uuid} minor {gpu.minor}, MIG {mig}")
        say(f"    CPUs near it: {nvml.ranges(gpu.cpus)}")
        for device in gpu.migs:
            say(
                f"    MIG device {device.uuid}: GPU instance {device.gpu_instance_id},"
                f" compute instance {device.compute_instance_id}, {device.slice_count}"
                f" slice(s), {device.memory_mib} MiB"
            )
    minors_file = Path(nvml.MIG_MINORS)
    try:
        mig_minors = nvml.parse_mig_minors(minors_file.read_text()) if minors_file.exists() else {}
        gres = nvml.gres_lines(
            gpus, os.cpu_count() or 1, nvml.threads_per_core(), mig_minors=mig_minors
        )
    except ValueError as exc:  # printed, then a failed check
        say(f"  gres.conf: {exc}")
        gres = []
    say("  gres.conf:")
    for line in gres:
        say(f"    {line}")
    check(bool(gres), "a gres.conf line from NVML")
    say(f"\n{len(failures)} failed check(s) of the above; {time.monotonic() - started:.1f} s")
    if out_file:
        out_file.write_text("\n".join(lines) + "\n")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--inside":
        try:
            inside(sys.argv[2], sys.argv[3])
        except Exception as exc:  # the parent prints what failed
            print(f"  could not build the root: {type(exc).__name__}: {exc}")
            sys.exit(1)
    else:
        main(sys.argv[1:])
