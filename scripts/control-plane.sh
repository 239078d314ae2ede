#!/usr/bin/env bash
# Install a local Kubernetes control plane for tests and the quickstart:
# Debian's etcd-server, and kube-apiserver, kube-controller-manager and kubectl v1.20.2
# built from Debian bookworm's `kubernetes` source package with Debian's Go.
#
# The binaries are cached outside the repo (default
# ~/.cache/capstan/kubernetes-1.20.2/bin, override with CAPSTAN_K8S_DIR), so
# only the first run builds (about 7 minutes on 2 cores); later runs take
# seconds. Prints the bin directory on its last line.
set -euo pipefail

version=1.20.2
cache="${CAPSTAN_K8S_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/capstan/kubernetes-$version}"
bin="$cache/bin"

need_apt=()
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
if ! [ -x "$bin/kube-apiserver" ] || ! [ -x "$bin/kube-controller-manager" ] || ! [ -x "$bin/kubectl" ]; then
    [ -x /usr/lib/go-1.19/bin/go ] || need_apt+=(golang-1.19-go)
    command -v dpkg-source >/dev/null 2>&1 || need_apt+=(dpkg-dev)
    [ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ] || need_apt+=(golang-github-modern-go-reflect2-dev)
    command -v make >/dev/null 2>&1 || need_apt+=(make)
    command -v rsync >/dev/null 2>&1 || need_apt+=(rsync)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "==> installing ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ -x "$bin/kube-apiserver" ] && [ -x "$bin/kube-controller-manager" ] && [ -x "$bin/kubectl" ]; then
    echo "$bin"
    exit 0
fi

# Source packages need a deb-src entry: copy the machine's bookworm entry.
if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list 2>/dev/null; then
    echo "==> adding deb-src entries"
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > /etc/apt/sources.list.d/capstan-deb-src.sources
    apt-get update -qq
fi

work="$cache/build"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
echo "==> fetching the kubernetes $version source package"
apt-get source -qq --download-only kubernetes >/dev/null
dpkg-source -x --no-check kubernetes_*.dsc src >/dev/null
cd src
upstream=$(dpkg-parsechangelog -S Version)
case "$upstream" in
    "$version"* | *"really$version"*) ;;
    *) echo "error: Debian's kubernetes source is $upstream, expected $version" >&2; exit 1 ;;
esac

# reflect2 v1.0.1 (vendored) crashes under Go >= 1.18 on the first custom
# object decode; Debian ships the fixed v1.0.2.
echo "==> replacing vendored modern-go/reflect2 with Debian's fixed version"
rm -rf vendor/github.com/modern-go/reflect2
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2

echo "==> building kube-apiserver, kube-controller-manager and kubectl (about 9 minutes on 2 cores)"
export PATH="/usr/lib/go-1.19/bin:$PATH" CGO_ENABLED=0 GOPROXY=off GOFLAGS=-mod=vendor GO111MODULE=on
export KUBE_GIT_VERSION="v$version" KUBE_GIT_TREE_STATE=clean
make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kubectl" >"$work/build.log" 2>&1 || {
    tail -40 "$work/build.log" >&2
    echo "error: the build failed; the full log is $work/build.log" >&2
    exit 1
}
mkdir -p "$bin.tmp"
for tool in kube-apiserver kube-controller-manager kubectl; do
    cp _output/local/bin/linux/*/$tool "$bin.tmp/" 2>/dev/null || cp _output/bin/$tool "$bin.tmp/"
done
rm -rf "$bin"
mv "$bin.tmp" "$bin"
cd "$cache"
rm -rf "$work"
"$bin/kube-apiserver" --version
echo "$bin"
