// The updater's logic on Node, the cloud's answers from a stand-in fetch.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { instanceId, progress, updater } from '../updater.js';

const machine = (version, providerId = 'sim://i-1', config = { endpoint: 'http://cloud:1/' }) => ({
  name: 'm1', namespace: 'default', uid: 'uid-1', clusterName: undefined, labels: [], version,
  failureDomain: undefined, providerConfig: JSON.stringify(config), infrastructureConfig: undefined, providerId,
});

const cloud = (answers) => {
  const sent = [];
  globalThis.fetch = async (url, init) => {
    sent.push({ url, method: init.method, body: init.body && new TextDecoder().decode(init.body) });
    const [status, body] = answers.shift();
    return new Response(JSON.stringify(body), { status });
  };
  return sent;
};

test('claims only the version', () => {
  assert.deepEqual(updater.canUpdate(machine('v1'), machine('v2'), ['labels', 'version']), ['version']);
  assert.deepEqual(updater.canUpdate(machine('v1'), machine('v1'), ['labels']), []);
});

test('progress is read from the instance', () => {
  assert.deepEqual(progress({ state: 'running', version: 'v2' }, 'v2'), { tag: 'done' });
  const p = progress({ state: 'updating', update: { targetVersion: 'v2', percent: 40 } }, 'v2');
  assert.deepEqual(p, { tag: 'in-progress', val: { retryAfterMs: 200n, percent: 40, message: 'updating to v2' } });
  assert.deepEqual(progress({ state: 'terminating' }, 'v2'), { tag: 'failed', val: 'the instance is being deleted' });
  assert.equal(progress({ state: 'running', version: 'v1' }, 'v2'), undefined);
});

test('update starts the change once and then follows it', async () => {
  const sent = cloud([[200, { id: 'i-1', state: 'running', version: 'v1' }], [202, {}]]);
  const started = await updater.update(machine('v1'), machine('v2'), ['version']);
  assert.equal(started.tag, 'in-progress');
  assert.deepEqual(sent.map((r) => `${r.method} ${r.url}`), ['GET http://cloud:1/v1/instances/i-1', 'POST http://cloud:1/v1/instances/i-1/update']);
  assert.deepEqual(JSON.parse(sent[1].body), { version: 'v2' });
  // Called again (after a restart, say): the update under way is followed, not restarted.
  const again = cloud([[200, { id: 'i-1', state: 'updating', update: { targetVersion: 'v2', percent: 60 } }]]);
  assert.equal((await updater.update(machine('v1'), machine('v2'), ['version'])).val.percent, 60);
  assert.equal(again.length, 1);
  // The cloud refuses: a failed update, reported with the cloud's words.
  cloud([[200, { id: 'i-1', state: 'running', version: 'v1' }], [409, { code: 'Conflict', message: 'busy' }]]);
  const refused = await updater.update(machine('v1'), machine('v2'), ['version']);
  assert.equal(refused.tag, 'failed');
  assert.match(refused.val, /the cloud refused the update: .*busy/);
});

test('bad input is a contract error naming what', async () => {
  const reason = async (fn) => (await fn().catch((e) => e)).payload;
  assert.match((await reason(() => updater.update(machine('v1'), machine(undefined), ['version']))).val, /version: the desired machine has no version/);
  assert.match((await reason(() => updater.update(machine('v1'), machine('v2', 'sim://i-1', { endpoint: 1 }), ['version']))).val, /endpoint: expected a string/);
  assert.equal((await reason(() => updater.update(machine('v1', null), machine('v2'), ['version']))).tag, 'terminal');
  assert.throws(() => instanceId('aws:///i-1'), (e) => e.payload.tag === 'terminal');
  assert.deepEqual(await updater.update(machine('v1'), machine('v2'), []), { tag: 'done' });
});
