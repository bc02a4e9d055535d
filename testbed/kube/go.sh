# Sourced by the build scripts under testbed/: a Go toolchain new enough for
# Kubernetes, and the wrapper module that builds Kubernetes commands.

# Kubernetes 1.36 needs Go >= 1.25. Where the machine's go is missing or
# older, take the official toolchain from the Go module proxy (the module the
# go command itself fetches for GOTOOLCHAIN) into CACHE/go.
#   ensure_go CACHE
ensure_go() {
  local cache=$1 go_min=1.25 toolchain=go1.26.8 v
  if command -v go >/dev/null 2>&1; then
    v=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
    [[ $(printf '%s\n%s\n' "$go_min" "$v" | sort -V | head -1) == "$go_min" ]] && return 0
  fi
  local gohome="$cache/go/$toolchain"
  if [[ ! -x $gohome/bin/go ]]; then
    echo "fetching Go $toolchain from the Go module proxy" >&2
    local fetch
    fetch=$(mktemp -d)
    curl -fsSL -o "$fetch/go.zip" \
      "https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-$toolchain.linux-amd64.zip"
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
      "$fetch/go.zip" "$fetch/x"
    mkdir -p "$(dirname "$gohome")"
    mv "$fetch/x/golang.org/toolchain@v0.0.1-$toolchain.linux-amd64" "$gohome"
    chmod +x "$gohome"/bin/* "$gohome"/pkg/tool/*/*
    rm -rf "$fetch"
  fi
  export PATH="$gohome/bin:$PATH" GOTOOLCHAIN=local
}

# How a build script starts: a finished OUT (`.complete`) is left alone and
# the script exits 0; otherwise a Go toolchain (ensure_go), OUT made, and a
# scratch directory $work, removed when the script exits.
#   start_build OUT
start_build() {
  [[ -f $1/.complete ]] && exit 0
  ensure_go "$(dirname "$1")"
  mkdir -p "$1"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
}

# k8s.io/kubernetes points its staging modules (k8s.io/api, client-go, ...) at
# ./staging by replace directives, so `go install ...@version` is refused. A
# wrapper module requires it and pins every staging module at the matching
# v0.MINOR.PATCH tag instead; the list comes from kubernetes' own go.mod.
#   kube_wrapper_module DIR K8S_VERSION   (writes DIR/go.mod; add tools.go, then go mod tidy)
kube_wrapper_module() {
  local dir=$1 k8s_version=$2 staging_version kube_gomod
  staging_version="v0.${k8s_version#v1.}"
  kube_gomod=$(go mod download -json "k8s.io/kubernetes@$k8s_version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  mkdir -p "$dir"
  {
    echo "module sunk.local/testbed/kube"
    echo
    echo "go $(sed -n 's/^go //p' "$kube_gomod")"
    echo
    echo "require k8s.io/kubernetes $k8s_version"
    echo
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/k8s.io/.*#replace \1 => \1 '"$staging_version"'#p' "$kube_gomod"
  } >"$dir/go.mod"
}

# Stamp the version as Kubernetes' own release build does: clients (kubectl,
# helm, kubelet's node status) read it and refuse or warn on v0.0.0-master.
#   kube_version_flags K8S_VERSION   (prints -X flags for -ldflags)
kube_version_flags() {
  local k8s_version=$1 minor pkg flags=""
  minor=${k8s_version#v1.}
  minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean"
  done
  printf '%s' "$flags"
}

# A module that carries no replace directives builds as its maintainers
# release it, in a wrapper module of its own that requires it (plain `go
# install mod@version` asks the proxy for the module's version list, which it
# refuses for some). Static, trimmed and stripped; LDFLAGS adds to `-s -w`.
#   go_module_build DIR MODULE VERSION OUTPUT LDFLAGS PACKAGE...   (OUTPUT as for `go build -o`)
go_module_build() {
  local dir=$1 module=$2 version=$3 output=$4 ldflags=$5
  shift 5
  mkdir -p "$dir"
  printf 'module sunk.local/testbed/%s\n\ngo 1.25\n\nrequire %s %s\n' \
    "$(basename "$module")" "$module" "$version" >"$dir/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    printf '\t_ "%s"\n' "$@"
    printf ')\n'
  } >"$dir/tools.go"
  (cd "$dir" && go mod tidy && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w$ldflags" -o "$output" "$@")
}
