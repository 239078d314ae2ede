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

need_apt=()
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
tools=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
have_all() {
    local tool
    for tool in "${tools[@]}"; do [ -x "$bin/$tool" ] || return 1; done
}
if ! have_all; then
    [ -x /usr/lib/go-1.19/bin/go ] || need_apt+=(golang-1.19-go)
    command -v dpkg-source >/dev/null 2>&1 || need_apt+=(dpkg-dev)
    [ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ] || need_apt+=(golang-github-modern-go-reflect2-dev)
    command -v make >/dev/null 2>&1 || need_apt+=(make)
    command -v rsync >/dev/null 2>&1 || need_apt+=(rsync)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
    say "installing ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if have_all; then
    echo "$bin"
    exit 0
fi

# Source packages need a deb-src entry: copy the machine's bookworm entry.
if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list 2>/dev/null; then
    say "adding deb-src entries"
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > /etc/apt/sources.list.d/capstan-deb-src.sources
    apt-get update -qq
fi

work="$cache/build"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
say "fetching the kubernetes $version source package and its kubectl (kubernetes-client)"
apt-get source -qq --download-only kubernetes >/dev/null
apt-get download -qq kubernetes-client 2>/dev/null
dpkg-deb -x kubernetes-client_*.deb client
"client/usr/bin/kubectl" version --client | grep -q "GitVersion:\"v$version\"" || {
    echo "error: Debian's kubernetes-client is not kubectl v$version" >&2
    exit 1
}
dpkg-source -x --no-check kubernetes_*.dsc src >/dev/null
cd src
upstream=$(dpkg-parsechangelog -S Version)
case "$upstream" in
    "$version"* | *"really$version"*) ;;
    *) echo "error: Debian's kubernetes source is $upstream, expected $version" >&2; exit 1 ;;
esac

# reflect2 v1.0.1 (vendored) crashes under Go >= 1.18 on the first custom
# object decode; Debian ships the fixed v1.0.2.
say "replacing vendored modern-go/reflect2 with Debian's fixed version"
rm -rf vendor/github.com/modern-go/reflect2
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2

# A cache missing any binary (e.g. one made before kube-scheduler was added)
# is rebuilt whole: the servers share one build.
servers=(kube-apiserver kube-controller-manager kube-scheduler)
say "building ${servers[*]} (about 8 minutes on 2 cores, longer beside another build; log: $work/build.log)"
# `providerless` leaves out the in-tree cloud providers (their SDKs are a
# large share of the build) that a local control plane never uses.
export PATH="/usr/lib/go-1.19/bin:$PATH" CGO_ENABLED=0 GOPROXY=off GOFLAGS="-mod=vendor -tags=providerless" GO111MODULE=on
export KUBE_GIT_VERSION="v$version" KUBE_GIT_TREE_STATE=clean
make WHAT="${servers[*]/#/cmd/}" >"$work/build.log" 2>&1 &
make_pid=$!
# The Go build is silent for minutes: say every 30 s that it is alive and
# which step the build log reached.
started=$SECONDS
while kill -0 "$make_pid" 2>/dev/null; do
    sleep 5
    if (( (SECONDS - started) % 30 < 5 )) && kill -0 "$make_pid" 2>/dev/null; then
        last=$(grep -v '^\s*$' "$work/build.log" | tail -n 1 | cut -c1-90)
        printf '    ... %dm%02ds elapsed%s\n' $(( (SECONDS - started) / 60 )) $(( (SECONDS - started) % 60 )) \
            "${last:+ (last: $last)}" >&2
    fi
done
if ! wait "$make_pid"; then
    tail -40 "$work/build.log" >&2
    echo "error: the build failed; the full log is $work/build.log" >&2
    exit 1
fi
say "built in $(( (SECONDS - started) / 60 ))m$(( (SECONDS - started) % 60 ))s"
mkdir -p "$bin.tmp"
for tool in "${servers[@]}"; do
    cp _output/local/bin/linux/*/$tool "$bin.tmp/" 2>/dev/null || cp _output/bin/$tool "$bin.tmp/"
done
cp "$work/client/usr/bin/kubectl" "$bin.tmp/"
rm -rf "$bin"
mv "$bin.tmp" "$bin"
cd "$cache"
rm -rf "$work"
"$bin/kube-apiserver" --version >&2
echo "$bin"
