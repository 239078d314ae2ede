// The provider's logic on Node, the cloud's answers from a stand-in fetch.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { instanceId, provider, status } from '../provider.js';

const machine = (config, providerId) => ({
  name: 'm1', namespace: 'default', uid: 'uid-1', clusterName: 'c1', labels: [], version: 'v1.30.0',
  failureDomain: undefined, providerConfig: JSON.stringify(config), infrastructureConfig: undefined, providerId,
});

test('config errors name the field', async () => {
  await provider.validate('{"endpoint":"http://127.0.0.1:1","instanceType":"small"}');
  const reason = async (config) => (await provider.validate(config).catch((e) => e)).payload.val;
  assert.match(await reason('{"endpoint":"127.0.0.1:1"}'), /endpoint: `127.0.0.1:1` must be/);
  assert.match(await reason('{"endpoint":"http://x","instanceType":"huge"}'), /instanceType: "huge" is not one of small, medium, large/);
  assert.match(await reason('{"endpoint":"http://x","tags":{"capstan.dev/x":"y"}}'), /tags: `capstan.dev\/x` is reserved/);
});

test('create posts the machine with its uid as the client token and maps the answer', async () => {
  const sent = [];
  globalThis.fetch = async (url, init) => {
    sent.push({ url, init });
    return new Response(JSON.stringify({ id: 'i-7', state: 'pending', privateIp: '10.0.0.7' }), { status: 201 });
  };
  const s = await provider.create(machine({ endpoint: 'http://cloud:1/' }), { format: 'cloud-config', value: new TextEncoder().encode('#cloud-config\n') });
  assert.equal(sent[0].url, 'http://cloud:1/v1/instances');
  const body = JSON.parse(new TextDecoder().decode(sent[0].init.body));
  assert.equal(body.clientToken, 'uid-1');
  assert.equal(body.tags['capstan.dev/machine'], 'default/m1');
  assert.equal(body.userData.value, 'I2Nsb3VkLWNvbmZpZwo=');
  assert.deepEqual(s, { providerId: 'sim://i-7', state: 'pending', addresses: [{ kind: 'internal-ip', address: '10.0.0.7' }],
    failureDomain: undefined, version: undefined, message: undefined });
});

test('provider IDs round-trip and foreign ones are refused', () => {
  assert.equal(instanceId('sim://i-000001'), 'i-000001');
  for (const bad of ['aws:///us-east-1/i-1', 'sim://', 'sim://../admin']) {
    assert.throws(() => instanceId(bad), (e) => e.payload.tag === 'terminal', bad);
  }
  assert.equal(status({ id: 'i-8', state: 'weird' }).state, 'unknown');
});

test('capacity asks the cloud for the instance type and maps its numbers', async () => {
  const sent = [];
  globalThis.fetch = async (url) => {
    sent.push(url);
    if (url.endsWith('/huge')) return new Response('{}', { status: 404 });
    return new Response(JSON.stringify({ name: 'medium', cpus: 4, memoryMiB: 16384, maxPods: 110, ephemeralDiskMiB: 102400 }), { status: 200 });
  };
  const c = await provider.capacity('{"endpoint":"http://cloud:1","instanceType":"medium"}');
  assert.equal(sent[0], 'http://cloud:1/v1/instance-types/medium');
  assert.deepEqual(c, { cpuMillis: 4000, memoryMib: 16384n, ephemeralDiskMib: 102400n, maxPods: 110, gpuCount: undefined, gpuType: undefined });
  const small = await provider.capacity('{"endpoint":"http://cloud:1"}');
  assert.equal(sent[1], 'http://cloud:1/v1/instance-types/small');
  assert.equal(small.cpuMillis, 4000);
});
