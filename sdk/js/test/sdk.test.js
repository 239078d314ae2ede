// The SDK's pure parts on Node: `npm test` (node --test).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  PluginError, checkConfig, daemonsetHealth, deploymentHealth, findObserved, invalidConfig,
  parseConfig, pickVersion, toBase64, transient, updateDone, updateFailed, updateInProgress, versionTable,
} from '../index.js';

const schema = {
  namespace: { type: 'string', default: 'monitoring' },
  port: { type: 'integer', default: 9100, min: 1, max: 65535 },
  tags: { type: 'object', values: 'string', default: {} },
  mode: { type: 'string', oneOf: ['a', 'b'], required: true },
};

const payload = (fn) => {
  try {
    fn();
  } catch (e) {
    assert.ok(e instanceof PluginError, `${e}`);
    return e.payload;
  }
  assert.fail('expected a PluginError');
};

test('defaults fill in and given fields are kept', () => {
  const c = parseConfig('{"mode":"a","port":9200}', schema);
  assert.deepEqual(c, { namespace: 'monitoring', port: 9200, tags: {}, mode: 'a' });
});

test('every bad config names its field', () => {
  const cases = [
    ['{"mode":"a","port":"x"}', 'config is invalid: port: expected an integer, got a string'],
    ['{"mode":"a","nope":1}', 'config is invalid: nope: unknown field; expected one of mode, namespace, port, tags'],
    ['{}', 'config is invalid: mode: missing (it is required)'],
    ['{"mode":"c"}', 'config is invalid: mode: "c" is not one of a, b'],
    ['{"mode":"a","port":0}', 'config is invalid: port: 0 is below the minimum of 1'],
    ['{"mode":"a","tags":{"team":1}}', 'config is invalid: tags.team: expected a string, got a number'],
    ['[1]', 'config is invalid: config: expected an object, got an array'],
  ];
  for (const [text, message] of cases) {
    assert.deepEqual(payload(() => parseConfig(text, schema)), { tag: 'invalid-config', val: message });
  }
  assert.match(payload(() => parseConfig('{', schema)).val, /^config is not valid JSON/);
});

test('nested objects name the whole path', () => {
  const nested = { limits: { type: 'object', fields: { cpu: { type: 'string', required: true } } } };
  assert.equal(payload(() => checkConfig({ limits: {} }, nested)).val, 'limits.cpu: missing (it is required)');
});

test('errors carry the contract payload componentize-js returns', () => {
  assert.deepEqual(invalidConfig('x').payload, { tag: 'invalid-config', val: 'x' });
  assert.deepEqual(transient('slow', 2500).payload, { tag: 'transient', val: { message: 'slow', retryAfterMs: 2500n } });
});

test('versions are tabled and picked', () => {
  const table = [['1.7.0', 'stable'], ['1.8.2', 'rapid'], ['1.8.2', 'stable']];
  assert.deepEqual(versionTable(table), [
    { version: '1.7.0', channels: ['stable'] },
    { version: '1.8.2', channels: ['rapid', 'stable'] },
  ]);
  assert.deepEqual(versionTable(table, { '1.8.2': '>=1.20.0' })[1], { version: '1.8.2', channels: ['rapid', 'stable'], kubernetes: '>=1.20.0' });
  assert.equal(pickVersion({ version: '1.8.2' }, table), '1.8.2');
  assert.equal(payload(() => pickVersion({ version: '2.0.0' }, table)).val, 'version: "2.0.0" is not one of 1.7.0, 1.8.2');
});

test('a daemonset is healthy when every node runs an updated ready pod', () => {
  const d = { kind: 'DaemonSet', metadata: { name: 'x', generation: 1 },
    status: { observedGeneration: 1, desiredNumberScheduled: 2, numberReady: 2, updatedNumberScheduled: 1 } };
  assert.equal(daemonsetHealth(d, 'x').healthy, false);
  d.status.updatedNumberScheduled = 2;
  assert.equal(daemonsetHealth(d, 'x').healthy, true);
  assert.equal(daemonsetHealth(undefined, 'x').message, 'DaemonSet x is not there');
  const observed = ['not json', JSON.stringify(d)];
  assert.equal(findObserved(observed, 'DaemonSet', 'x').metadata.name, 'x');
  assert.equal(findObserved(observed, 'DaemonSet', 'y'), undefined);
});

test('a deployment is healthy only when rolled out and available', () => {
  const d = { metadata: { generation: 2 }, spec: { replicas: 2 },
    status: { observedGeneration: 1, updatedReplicas: 2, availableReplicas: 2 } };
  assert.equal(deploymentHealth(d, 'x').healthy, false);
  d.status.observedGeneration = 2;
  assert.equal(deploymentHealth(d, 'x').healthy, true);
  d.status.availableReplicas = 1;
  assert.deepEqual(deploymentHealth(d, 'x').details[0], ['availableReplicas', '1/2']);
});

test('base64 matches the standard encoding', () => {
  for (const text of ['', 'a', 'ab', 'abc', 'hello world', '#cloud-config\nruncmd: []\n']) {
    const bytes = new TextEncoder().encode(text);
    assert.equal(toBase64(bytes), Buffer.from(bytes).toString('base64'), text);
  }
});

test('updater answers have the contract shape, bounds applied', () => {
  assert.deepEqual(updateDone(), { tag: 'done' });
  assert.deepEqual(updateInProgress(200, 40.4, 'half way'), {
    tag: 'in-progress', val: { retryAfterMs: 200n, percent: 40, message: 'half way' },
  });
  assert.deepEqual(updateInProgress(0, 140), {
    tag: 'in-progress', val: { retryAfterMs: 1n, percent: 100, message: undefined },
  });
  assert.equal(updateInProgress().val.percent, undefined);
  assert.deepEqual(updateFailed('no'), { tag: 'failed', val: 'no' });
});
