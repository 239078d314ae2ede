// @capstan/plugin/http-fetch and @capstan/plugin/http on Node, with `fetch`
// replaced by a recorder (the latter through the testing stand-in for
// capstan:plugin/http: run with `--import ./testing/register.js`).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { apiError, send } from '../http-fetch.js';
import { send as sendCapstan } from '../http.js';

test('every request carries its exact content-length and JSON body', async () => {
  const seen = [];
  globalThis.fetch = async (url, init) => {
    seen.push({ url, init });
    return new Response('{"id":"i-1"}', { status: 201, headers: { 'content-type': 'application/json' } });
  };
  const answer = await send('POST', 'http://h:1/v1/instances', { name: 'é' });
  assert.equal(answer.status, 201);
  assert.equal(seen[0].init.headers['content-length'], String(new TextEncoder().encode('{"name":"é"}').length));
  assert.equal(new TextDecoder().decode(seen[0].init.body), '{"name":"é"}');
  await send('DELETE', 'http://h:1/v1/instances/i-1');
  assert.equal(seen[1].init.headers['content-length'], '0');
  assert.equal(seen[1].init.body, undefined);
});

test('failures and answers map to contract errors', async () => {
  globalThis.fetch = async () => { throw new TypeError('HTTP request denied'); };
  await assert.rejects(send('GET', 'http://h:1/x'), (e) => e.payload.tag === 'unauthorized');
  globalThis.fetch = async () => { throw new TypeError('connection refused'); };
  await assert.rejects(send('GET', 'http://h:1/x'), (e) => e.payload.tag === 'transient');
  await assert.rejects(send('GET', 'ftp://h/x'), (e) => e.payload.tag === 'invalid-config');
  const answer = (status, headers = {}) => ({ status, headers, text: '{"code":"Throttling","message":"slow"}' });
  assert.equal(apiError(answer(404), 'x').payload.tag, 'not-found');
  assert.equal(apiError(answer(429, { 'retry-after': '3' }), 'x').payload.val.retryAfterMs, 3000n);
  assert.equal(apiError(answer(503), 'x').payload.val.retryAfterMs, 5000n);
  assert.equal(apiError(answer(422), 'creating').payload.val, 'creating: HTTP 422 Throttling: slow');
  assert.equal(apiError(answer(409), 'x').payload.tag, 'terminal');
});

test('capstan:plugin/http: the host frames the body, and its refusals map as fetch failures do', async () => {
  const seen = [];
  globalThis.fetch = async (url, init) => {
    seen.push({ url, init });
    return new Response('{"id":"i-1"}', { status: 201, headers: { 'x-a': 'b' } });
  };
  const answer = await sendCapstan('POST', 'http://h:1/v1/instances', { name: 'é' });
  assert.deepEqual([answer.status, answer.headers['x-a'], JSON.parse(answer.text).id], [201, 'b', 'i-1']);
  assert.equal(seen[0].init.headers['content-length'], undefined, 'the host sets it');
  assert.equal(seen[0].init.headers['content-type'], 'application/json');
  assert.equal(new TextDecoder().decode(seen[0].init.body), '{"name":"é"}');
  globalThis.fetch = async () => { throw new TypeError('HTTP request denied'); };
  await assert.rejects(sendCapstan('GET', 'http://h:1/x'), (e) => e.payload.tag === 'unauthorized');
  globalThis.fetch = async () => { throw new TypeError('connection refused'); };
  await assert.rejects(sendCapstan('GET', 'http://h:1/x'), (e) => e.payload.tag === 'transient');
  await assert.rejects(sendCapstan('GET', 'ftp://h/x'), (e) => e.payload.tag === 'invalid-config');
});
