"""`node-exporter-py`: the `node-exporter` addon (plugins/node-exporter-addon)
in Python. It runs the Prometheus node exporter on every Node as a
DaemonSet, in a Namespace of its own.

Two versions, one per channel: 1.7.0 (stable) and 1.8.2 (rapid). Config
(all optional): `namespace` (`monitoring`), `port` (9100, unprivileged),
`createNamespace` (true; false renders into an existing namespace, such as
a tenant's own). Health is the DaemonSet's rollout.

Built with componentize-py for the `addon-plugin` world and annotated with
capstan-plugin.json (scripts/build-polyglot-plugins.sh).
"""

import json
from dataclasses import dataclass

from capstan_plugin import invalid_config, log, parse_config
from capstan_plugin.addon import daemonset_health, find_observed, pick_version, version_table
from wit_world import exports

VERSIONS = [("1.7.0", "stable"), ("1.8.2", "rapid")]
# The Kubernetes versions each supports (the host applies a version only within them).
KUBERNETES = {"1.7.0": ">=1.16.0", "1.8.2": ">=1.20.0"}
NAME = "node-exporter"


@dataclass
class AddonConfig:
    namespace: str = "monitoring"
    port: int = 9100
    create_namespace: bool = True


def parse(text: str) -> AddonConfig:
    config = parse_config(text, AddonConfig, "addon config")
    if not 1024 <= config.port <= 65535:
        raise invalid_config(f"port: {config.port} is not an unprivileged port; use 1024 to 65535")
    if not config.namespace:
        raise invalid_config("namespace: must not be empty")
    return config


def objects(version: str, config: AddonConfig) -> list[dict]:
    ns = config.namespace
    labels = {"app.kubernetes.io/name": NAME}
    args = ["--path.rootfs=/host", f"--web.listen-address=:{config.port}"]
    # 1.8 reads systemd units too.
    if version != "1.7.0":
        args.append("--collector.systemd")
    out = []
    if config.create_namespace:
        out.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    out += [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": ns}},
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": NAME, "namespace": ns, "labels": labels},
            "spec": {
                "selector": {"matchLabels": labels},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": NAME,
                        "hostNetwork": True,
                        "hostPID": True,
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [
                            {
                                "name": NAME,
                                "image": f"quay.io/prometheus/node-exporter:v{version}",
                                "args": args,
                                "ports": [{"name": "metrics", "containerPort": config.port, "protocol": "TCP"}],
                                "volumeMounts": [{"name": "root", "mountPath": "/host", "readOnly": True}],
                            }
                        ],
                        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": NAME, "namespace": ns, "labels": labels},
            "spec": {
                "selector": labels,
                "clusterIP": "None",
                "ports": [{"name": "metrics", "port": config.port, "targetPort": config.port, "protocol": "TCP"}],
            },
        },
    ]
    return out


class Addon(exports.Addon):
    def versions(self):
        return version_table(VERSIONS, KUBERNETES)

    def render(self, spec) -> list[str]:
        version = pick_version(spec, VERSIONS)
        config = parse(spec.config)
        rendered = [json.dumps(o, separators=(",", ":")) for o in objects(version, config)]
        log.info("rendered", version=version, objects=len(rendered))
        return rendered

    def assess(self, spec, observed: list[str]):
        return daemonset_health(find_observed(observed, "DaemonSet", NAME), NAME)
