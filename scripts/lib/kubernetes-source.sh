# Shared by control-plane.sh and node-parts.sh: fetch Debian bookworm's
# `kubernetes` source package (v1.20.2, with its full vendor/ tree), patch
# what Go >= 1.18 needs, and build commands from it with Debian's Go.
# Sourced, not run. Expects `say` and `version`.

# Install the Debian packages building needs (Go 1.19, dpkg-dev, the fixed
# reflect2, make, rsync) and a deb-src entry.
k8s_source_prerequisites() {
    local need=()
    [ -x /usr/lib/go-1.19/bin/go ] || need+=(golang-1.19-go)
    command -v dpkg-source >/dev/null 2>&1 || need+=(dpkg-dev)
    [ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ] || need+=(golang-github-modern-go-reflect2-dev)
    command -v make >/dev/null 2>&1 || need+=(make)
    command -v rsync >/dev/null 2>&1 || need+=(rsync)
    if [ ${#need[@]} -gt 0 ]; then
        say "installing ${need[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    fi
    # Source packages need a deb-src entry: copy the machine's bookworm entry.
    if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list 2>/dev/null; then
        say "adding deb-src entries"
        sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > /etc/apt/sources.list.d/capstan-deb-src.sources
        apt-get update -qq
    fi
}

# Unpack the source package into "$1/src" (the current directory must be
# "$1"), checked to be v$version, with the vendored reflect2 replaced.
k8s_source_unpack() {
    apt-get source -qq --download-only kubernetes >/dev/null
    dpkg-source -x --no-check kubernetes_*.dsc src >/dev/null
    local upstream
    upstream=$(cd src && dpkg-parsechangelog -S Version)
    case "$upstream" in
        "$version"* | *"really$version"*) ;;
        *) echo "error: Debian's kubernetes source is $upstream, expected $version" >&2; exit 1 ;;
    esac
    # reflect2 v1.0.1 (vendored) crashes under Go >= 1.18 on the first
    # custom object decode; Debian ships the fixed v1.0.2.
    say "replacing vendored modern-go/reflect2 with Debian's fixed version"
    rm -rf src/vendor/github.com/modern-go/reflect2
    cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 src/vendor/github.com/modern-go/reflect2
}

# Build the commands named (cmd/NAME) in ./src into "$2", logging to "$1";
# says every 30 s that the silent Go build is alive.
k8s_source_build() {
    local log="$1" out="$2"
    shift 2
    (
        cd src
        # `providerless` leaves out the in-tree cloud providers (their SDKs
        # are a large share of the build), which no local cluster uses.
        export PATH="/usr/lib/go-1.19/bin:$PATH" CGO_ENABLED=0 GOPROXY=off GOFLAGS="-mod=vendor -tags=providerless" GO111MODULE=on
        export KUBE_GIT_VERSION="v$version" KUBE_GIT_TREE_STATE=clean
        make WHAT="${*/#/cmd/}" >"$log" 2>&1
    ) &
    local make_pid=$! started=$SECONDS last
    while kill -0 "$make_pid" 2>/dev/null; do
        sleep 5
        if (( (SECONDS - started) % 30 < 5 )) && kill -0 "$make_pid" 2>/dev/null; then
            last=$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-90)
            printf '    ... %dm%02ds elapsed%s\n' $(( (SECONDS - started) / 60 )) $(( (SECONDS - started) % 60 )) \
                "${last:+ (last: $last)}" >&2
        fi
    done
    if ! wait "$make_pid"; then
        tail -40 "$log" >&2
        echo "error: the build failed; the full log is $log" >&2
        exit 1
    fi
    say "built $* in $(( (SECONDS - started) / 60 ))m$(( (SECONDS - started) % 60 ))s"
    mkdir -p "$out"
    local tool
    for tool in "$@"; do
        cp src/_output/local/bin/linux/*/"$tool" "$out/" 2>/dev/null || cp src/_output/bin/"$tool" "$out/"
    done
}
