#!/usr/bin/env bash
# Install what a real Kubernetes node needs, for the simulated cloud's real
# instances (`instanceType: real`, tests/sim-cloud/src/realnode): Debian's
# containerd, runc, CNI plugins, cloud-init, busybox-static (the local pause
# and busybox images), socat (the node's loopback relays), conntrack and
# iptables; and kubelet and kubeadm v1.20.2 built from the same Debian
# source package as the control plane (scripts/control-plane.sh), cached
# outside the repo (default ~/.cache/capstan/kubernetes-1.20.2/node-bin,
# override the parent with CAPSTAN_K8S_DIR). The first run builds (about 5
# minutes on 2 cores); later runs take a second. Progress goes to stderr;
# stdout is only the bin directory, on its last line.
set -euo pipefail

say() { echo "==> $*" >&2; }

version=1.20.2
cache="${CAPSTAN_K8S_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/capstan/kubernetes-$version}"
bin="$cache/node-bin"
here="$(cd "$(dirname "$0")" && pwd)"

need_apt=()
command -v containerd >/dev/null 2>&1 || need_apt+=(containerd)
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
[ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
command -v cloud-init >/dev/null 2>&1 || need_apt+=(cloud-init)
[ -x /bin/busybox ] || need_apt+=(busybox-static)
command -v socat >/dev/null 2>&1 || need_apt+=(socat)
command -v conntrack >/dev/null 2>&1 || need_apt+=(conntrack)
command -v iptables >/dev/null 2>&1 || need_apt+=(iptables)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
if [ ${#need_apt[@]} -gt 0 ]; then
    say "installing ${need_apt[*]} (a real node's parts)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# This machine is not a node: the packages' services stay off (the
# simulated cloud starts a containerd per instance, in its own namespaces).
if [ -d /run/systemd/system ]; then
    systemctl disable --now containerd >/dev/null 2>&1 || true
fi
pkill -x containerd 2>/dev/null || true
mkdir -p /etc/cloud && touch /etc/cloud/cloud-init.disabled

tools=(kubelet kubeadm)
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
work="$cache/node-build"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
say "fetching the kubernetes $version source package"
k8s_source_unpack
say "building ${tools[*]} (about 5 minutes on 2 cores; log: $work/build.log)"
k8s_source_build "$work/build.log" "$bin.tmp" "${tools[@]}"
rm -rf "$bin"
mv "$bin.tmp" "$bin"
cd "$cache"
rm -rf "$work"
"$bin/kubelet" --version >&2
echo "$bin"
