// `node-exporter-js`: the `node-exporter` addon (plugins/node-exporter-addon)
// in JavaScript. It runs the Prometheus node exporter on every Node as a
// DaemonSet, in a Namespace of its own.
//
// Two versions, one per channel: 1.7.0 (stable) and 1.8.2 (rapid). Config
// (all optional): `namespace` (`monitoring`), `port` (9100, unprivileged),
// `createNamespace` (true; false renders into an existing namespace, such
// as a tenant's own). Health is the DaemonSet's rollout.
//
// Built by scripts/build-plugins.sh: bundled with the SDK (rolldown),
// componentized for the `addon-plugin` world (componentize-js), annotated
// with capstan-plugin.json (`capstan plugin annotate`).
import { daemonsetHealth, findObserved, invalidConfig, parseConfig, pickVersion, versionTable } from '@capstan/plugin';
import { info } from '@capstan/plugin/log';

export const VERSIONS = [['1.7.0', 'stable'], ['1.8.2', 'rapid']];
/** The Kubernetes versions each supports (the host applies a version only within them). */
export const KUBERNETES = { '1.7.0': '>=1.16.0', '1.8.2': '>=1.20.0' };
const NAME = 'node-exporter';

const CONFIG = {
  namespace: { type: 'string', default: 'monitoring' },
  port: { type: 'integer', default: 9100, max: 65535 },
  createNamespace: { type: 'boolean', default: true },
};

export function objects(version, config) {
  const ns = config.namespace;
  const labels = { 'app.kubernetes.io/name': NAME };
  const args = ['--path.rootfs=/host', `--web.listen-address=:${config.port}`];
  // 1.8 reads systemd units too.
  if (version !== '1.7.0') args.push('--collector.systemd');
  const out = [];
  if (config.createNamespace) out.push({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: ns } });
  out.push(
    { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: NAME, namespace: ns } },
    {
      apiVersion: 'apps/v1', kind: 'DaemonSet',
      metadata: { name: NAME, namespace: ns, labels },
      spec: {
        selector: { matchLabels: labels },
        updateStrategy: { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 1 } },
        template: {
          metadata: { labels },
          spec: {
            serviceAccountName: NAME,
            hostNetwork: true,
            hostPID: true,
            tolerations: [{ operator: 'Exists' }],
            containers: [{
              name: NAME,
              image: `quay.io/prometheus/node-exporter:v${version}`,
              args,
              ports: [{ name: 'metrics', containerPort: config.port, protocol: 'TCP' }],
              volumeMounts: [{ name: 'root', mountPath: '/host', readOnly: true }],
            }],
            volumes: [{ name: 'root', hostPath: { path: '/' } }],
          },
        },
      },
    },
    {
      apiVersion: 'v1', kind: 'Service',
      metadata: { name: NAME, namespace: ns, labels },
      spec: {
        selector: labels, clusterIP: 'None',
        ports: [{ name: 'metrics', port: config.port, targetPort: config.port, protocol: 'TCP' }],
      },
    },
  );
  return out;
}

export const addon = {
  versions() {
    return versionTable(VERSIONS, KUBERNETES);
  },
  render(spec) {
    const version = pickVersion(spec, VERSIONS);
    const config = parseConfig(spec.config, CONFIG, 'addon config');
    if (config.port < 1024) {
      throw invalidConfig(`port: ${config.port} is privileged; use 1024 or above`);
    }
    const rendered = objects(version, config).map((o) => JSON.stringify(o));
    info('rendered', { version, objects: rendered.length });
    return rendered;
  },
  assess(_spec, observed) {
    return daemonsetHealth(findObserved(observed, 'DaemonSet', NAME), NAME);
  },
};
