#!/usr/bin/env bash
# Installs what sunk's development and tests need on this machine, and only
# what is missing: Debian packages and the Python virtualenv (.venv) with sunk,
# its test bed (sunk_testbed) and dev tools. (The Go toolchain is
# testbed/kube/build.sh's business.)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[bootstrap] %s\n' "$*" >&2; }

# Debian packages: debootstrap builds the Slurm root filesystem; iproute2 and
# util-linux give the namespaces the test bed and the local nodes run in;
# buildah, runc, skopeo, umoci and docker-registry build, check and serve the
# container images (sunk_testbed.images).
need=()
for pkg in debootstrap iproute2 util-linux ca-certificates curl python3-venv \
  buildah runc skopeo umoci docker-registry; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  say "apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# Python: a virtualenv in the repo, reinstalled only when pyproject.toml changes.
python=${PYTHON:-python3}
stamp=.venv/.pyproject.sha256
sum=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -x .venv/bin/python ]] || [[ $(cat "$stamp" 2>/dev/null) != "$sum" ]]; then
  say "installing sunk, its test bed and dev tools into .venv"
  [[ -x .venv/bin/python ]] || "$python" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev,testbed]'
  echo "$sum" >"$stamp"
fi
