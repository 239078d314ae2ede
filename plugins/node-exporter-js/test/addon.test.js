// The addon's logic on Node: `npm test` (after `npm install`).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { addon, VERSIONS } from '../addon.js';

const spec = (version, config = {}) => ({
  name: 'ne', namespace: 'default', version, channel: undefined, config: JSON.stringify(config),
});

test('each version renders its namespace first and its own image', () => {
  for (const [version] of VERSIONS) {
    const objects = addon.render(spec(version, { port: 9200 })).map((o) => JSON.parse(o));
    assert.equal(objects[0].kind, 'Namespace');
    const ds = objects.find((o) => o.kind === 'DaemonSet');
    assert.equal(ds.spec.template.spec.containers[0].image, `quay.io/prometheus/node-exporter:v${version}`);
    assert.ok(JSON.stringify(objects).includes(':9200'));
  }
  assert.deepEqual(globalThis.capstanLogs.at(-1).fields, [['version', '1.8.2'], ['objects', '4']]);
});

test('an existing namespace is rendered into, not created', () => {
  const objects = addon.render(spec('1.7.0', { namespace: 'team-a', createNamespace: false })).map((o) => JSON.parse(o));
  assert.equal(objects.length, 3);
  assert.ok(objects.every((o) => o.kind !== 'Namespace' && o.metadata.namespace === 'team-a'));
});

test('a privileged port and a wrong type are invalid-config naming the field', () => {
  assert.throws(() => addon.render(spec('1.7.0', { port: 80 })), (e) => e.payload.val.startsWith('port: 80 is privileged'));
  assert.throws(() => addon.render(spec('1.7.0', { port: 'x' })), (e) => e.payload.val.includes('port: expected an integer'));
});

test('health is the DaemonSet rollout', () => {
  const ds = { kind: 'DaemonSet', metadata: { name: 'node-exporter', generation: 1 },
    status: { observedGeneration: 1, desiredNumberScheduled: 2, numberReady: 2, updatedNumberScheduled: 2 } };
  assert.equal(addon.assess(spec('1.7.0'), [JSON.stringify(ds)]).healthy, true);
  assert.equal(addon.assess(spec('1.7.0'), []).healthy, false);
});
