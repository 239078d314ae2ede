#!/usr/bin/env bash
# Install a local Kubernetes control plane for tests and the quickstart:
# Debian's etcd-server, and kube-apiserver, kube-controller-manager,
# kube-scheduler v1.20.2 built from Debian bookworm's `kubernetes` source
# package with Debian's Go, and kubectl v1.20.2 from the binary package that
# source builds (`kubernetes-client`, unpacked into the cache, not installed:
# it would clash with other kubectl packages).
#
# The binaries are cached outside the repo (default
# ~/.cache/capstan/kubernetes-1.20.2/bin, override with CAPSTAN_K8S_DIR), so
# only the first run builds (about 10 minutes on 2 cores, installing Go and etcd included); later runs take
# seconds. Progress goes to stderr; stdout is only the bin directory, on its
# last line, so callers can `$(scripts/control-plane.sh | tail -n 1)`.
set -euo pipefail

say() { echo "==> $*" >&2; }

version=1.20.2
cache="${CAPSTAN_K8S_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/capstan/kubernetes-$version}"
bin="$cache/bin"

here="$(cd "$(dirname "$0")" && pwd)"

need_apt=()
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
if [ ${#need_apt[@]} -gt 0 ]; then
    say "installing ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
tools=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
have_all() {
    local tool
    for tool in "${tools[@]}"; do [ -x "$bin/$tool" ] || return 1; done
}
if have_all; then
    echo "$bin"
    exit 0
fi

# shellcheck source=lib/kubernetes-source.sh
. "$here/lib/kubernetes-source.sh"
k8s_source_prerequisites
work="$cache/build"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
say "fetching the kubernetes $version source package and its kubectl (kubernetes-client)"
apt-get download -qq kubernetes-client 2>/dev/null
dpkg-deb -x kubernetes-client_*.deb client
"client/usr/bin/kubectl" version --client | grep -q "GitVersion:\"v$version\"" || {
    echo "error: Debian's kubernetes-client is not kubectl v$version" >&2
    exit 1
}
k8s_source_unpack

# A cache missing any binary (e.g. one made before kube-scheduler was added)
# is rebuilt whole: the servers share one build.
servers=(kube-apiserver kube-controller-manager kube-scheduler)
say "building ${servers[*]} (about 8 minutes on 2 cores, longer beside another build; log: $work/build.log)"
k8s_source_build "$work/build.log" "$bin.tmp" "${servers[@]}"
cp "$work/client/usr/bin/kubectl" "$bin.tmp/"
rm -rf "$bin"
mv "$bin.tmp" "$bin"
cd "$cache"
rm -rf "$work"
"$bin/kube-apiserver" --version >&2
echo "$bin"
