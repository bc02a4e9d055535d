"""Whether NVIDIA's container toolkit on a node lets a container's own
settings hand it GPUs (pure).

sunk hands GPUs out only as CDI devices. Where NVIDIA's container toolkit is
installed, its hook also reads each container's `NVIDIA_VISIBLE_DEVICES`
and, by default, gives an unprivileged container every GPU whose
environment says `all` (every CUDA base image does): a tenant's pod, or any
pod on a Slurm node, would take GPUs Slurm gave to someone else. Two
settings of its config.toml decide it; both must be off on Slurm's GPU
nodes:

- `accept-nvidia-visible-devices-envvar-when-unprivileged` (default true);
- `accept-nvidia-visible-devices-as-volume-mounts` (default false): GPUs
  named by volume mounts under /var/run/nvidia-container-devices.

`unsafe_settings` reads the file's text and names each setting that lets
them through; sunk's GPU plugin serves no GPU on a node where one does.
"""

from __future__ import annotations

import tomllib

# Where the toolkit reads its config on a node.
CONFIG_PATH = "/etc/nvidia-container-runtime/config.toml"
ENVVAR = "accept-nvidia-visible-devices-envvar-when-unprivileged"
VOLUME_MOUNTS = "accept-nvidia-visible-devices-as-volume-mounts"
# Each setting: the toolkit's own default where the file leaves it out, and
# what of a container's own it then takes GPUs from.
SETTINGS = {ENVVAR: (True, "environment"), VOLUME_MOUNTS: (False, "volume mounts")}


def unsafe_settings(text: str, path: str = CONFIG_PATH) -> list[str]:
    """Why the toolkit configured by `text` may hand a container GPUs by its
    own environment or mounts, one line per setting; [] if it may not. A
    file that does not parse is unsafe too (the toolkit would not read it
    either, and falls back to its defaults)."""
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        return [f"{path}: not TOML ({error}); the toolkit's default {ENVVAR} = true applies"]
    problems = []
    for setting, (default, source) in SETTINGS.items():
        value = config.get(setting, default)
        if value is not False:
            said = "not set, so true" if setting not in config else f"{value!r}"
            problems.append(
                f"{path}: {setting} is {said}: a container's own {source} would get it "
                f"every GPU it names; set `{setting} = false`"
            )
    return problems
