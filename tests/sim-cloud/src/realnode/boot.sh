#!/bin/bash
# The first process of a real instance of the simulated cloud, as a cloud
# image's init would run it: PID 1 of the instance's own PID, mount, UTS
# and network namespaces (made by `unshare`, see mod.rs). It gives the
# instance its own root (the host's, with /etc, /var/lib, /var/log, /root
# and /usr/local copied on write into the instance's directory, and /run
# and /tmp its own), its network (one veth pair inside the namespace: the
# Node's address never leaves it), loopback relays to the API server (and
# from the API server's egress proxy to the kubelet), starts containerd
# with the local pause and busybox images imported, hands the Machine's
# user data to real cloud-init as a NoCloud seed, and stays up as init.
#
# Everything comes from the environment (mod.rs sets it):
#   NODE_DIR      the instance's directory (seed/, image/, the copy-on-write layers)
#   CLOUD_DIR     the cloud's (images/, api.sock)
#   NODE_ID       the instance id (i-000001): its provider ID is sim://NODE_ID
#   NODE_IP       its address inside its own network namespace
#   NODE_INDEX    a small number, unique among live instances (pod CIDR)
#   API_PORT      the API server's loopback port (cluster-info's server)
#   NODE_BIN      where kubelet and kubeadm are
#   NODE_CGROUP   the cgroup every process of the instance lives under
set -euo pipefail
log() { echo "[boot $(date +%T.%3N)] $*"; }

# Its own /run, and there the instance's and the cloud's directories
# (wherever they are on the host, /tmp included, they stay in sight).
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/capstan/node /run/capstan/cloud
mount --bind "$NODE_DIR" /run/capstan/node
mount --bind "$CLOUD_DIR" /run/capstan/cloud
NODE_DIR=/run/capstan/node
API_SOCK=/run/capstan/cloud/api.sock
IMAGES=/run/capstan/cloud/images

# Its own hostname (the UTS namespace; never the host's).
hostname "$NODE_ID"

# Every process of the instance, and the pods its kubelet starts, under one
# cgroup per controller (v1: a child needs cpuset's cpus and mems first).
for controller in /sys/fs/cgroup/*/; do
    group="$controller$NODE_CGROUP"
    mkdir -p "$group"
    if [ -f "$controller/cpuset.cpus" ]; then
        cat "$controller/cpuset.cpus" > "$group/cpuset.cpus"
        cat "$controller/cpuset.mems" > "$group/cpuset.mems"
    fi
    echo $$ > "$group/cgroup.procs"
done

# Network: loopback, and eth0 with the Node's address.
ip link set lo up
ip link add eth0 type veth peer name eth0-peer
ip addr add "$NODE_IP/24" dev eth0
ip link set eth0 up
ip link set eth0-peer up
ip route add default dev eth0
echo 1 > /proc/sys/net/ipv4/ip_forward

# Its own root: copy-on-write over the host's configuration and state.
cow() {
    mkdir -p "$NODE_DIR/upper$1" "$NODE_DIR/work$1"
    mount -t overlay overlay -o "lowerdir=$1,upperdir=$NODE_DIR/upper$1,workdir=$NODE_DIR/work$1" "$1"
}
for d in /etc /var/lib /var/log /root /usr/local; do cow "$d"; done
mount -t tmpfs -o mode=1777 tmpfs /tmp
# containerd's overlay snapshots cannot sit on an overlay: a plain directory.
mkdir -p "$NODE_DIR/containerd" /var/lib/containerd
mount --bind "$NODE_DIR/containerd" /var/lib/containerd

# The kernel settings the kubelet wants (it writes them when they differ,
# and they are the host's, not the instance's): shown as wanted, read-only.
mkdir -p "$NODE_DIR/sysctl"
for setting in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
    kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
    key=${setting%%=*} value=${setting#*=}
    file="$NODE_DIR/sysctl/${key//\//.}"
    echo "$value" > "$file"
    mount --bind -o ro "$file" "/proc/sys/$key"
done

# What the image ships: kubelet and kubeadm, and systemctl as kubeadm's
# systemd drop-in needs it (kubeadm restarts the kubelet through it).
install -m 0755 "$NODE_BIN/kubelet" "$NODE_BIN/kubeadm" /usr/local/bin/
install -m 0755 "$NODE_DIR/image/systemctl" /usr/local/bin/systemctl
mkdir -p /usr/local/lib/capstan /etc/kubernetes/manifests /etc/cni/net.d /etc/containerd /etc/default
install -m 0755 "$NODE_DIR/image/kubelet-service" /usr/local/lib/capstan/kubelet-service
cp "$NODE_DIR/image/containerd.toml" /etc/containerd/config.toml
cp "$NODE_DIR/image/cni.conflist" /etc/cni/net.d/10-capstan.conflist
cp "$NODE_DIR/image/kubelet.default" /etc/default/kubelet
cp "$NODE_DIR/image/cloud.cfg" /etc/cloud/cloud.cfg
rm -f /etc/cloud/cloud-init.disabled /etc/cloud/cloud.cfg.d/*
echo "$NODE_IP $NODE_ID" >> /etc/hosts
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Loopback relays: the API server's address (cluster-info) answers here,
# and the API server's egress proxy reaches the kubelet.
socat "TCP-LISTEN:$API_PORT,bind=127.0.0.1,fork,reuseaddr" "UNIX-CONNECT:$API_SOCK" &
rm -f "$NODE_DIR/kubelet.sock"
socat "UNIX-LISTEN:$NODE_DIR/kubelet.sock,fork" "TCP:127.0.0.1:10250" &

log "starting containerd"
containerd --config /etc/containerd/config.toml > /var/log/containerd.log 2>&1 &
for _ in $(seq 100); do [ -S /run/containerd/containerd.sock ] && break; sleep 0.1; done
for image in pause busybox; do
    ctr -n k8s.io images import "$IMAGES/$image.tar" > /dev/null
done
log "images: $(ctr -n k8s.io images ls -q | tr '\n' ' ')"

# The Machine's user data, as a cloud's metadata service hands it over.
mkdir -p /var/lib/cloud/seed/nocloud
cp "$NODE_DIR/seed/user-data" "$NODE_DIR/seed/meta-data" /var/lib/cloud/seed/nocloud/
log "cloud-init"
(
    cloud-init init --local &&
        cloud-init init &&
        cloud-init modules --mode=config &&
        cloud-init modules --mode=final
) > /var/log/cloud-init-output.log 2>&1 || log "cloud-init failed: $(tail -5 /var/log/cloud-init-output.log)"
log "cloud-init done: $(cat /run/cloud-init/result.json 2>/dev/null | tr -d '\n ')"

# Init: reap whatever the instance's processes leave behind, until killed.
trap 'exit 0' TERM INT
while :; do
    sleep 3600 &
    wait $! || true
done
