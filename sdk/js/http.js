// Outbound HTTP through `capstan:plugin/http` (contract 0.3.0): one host
// call per request, where `fetch` (wasi:http) takes about a dozen. A plugin
// that imports this needs a 0.3.0 host and a manifest saying
// `"contract": "0.3.0"`; for older hosts import `@capstan/plugin/http-fetch`
// instead (same functions). The host lets through only destinations the
// manifest declares and an admin grants, and attaches the credential
// itself: never put one in a request. It frames the body itself.
import { send as hostSend } from 'capstan:plugin/http@0.3.0';
import { invalidConfig, transient, unauthorized } from './index.js';
import { checkUrl, encodeBody } from './http-common.js';

export { apiError, toPluginError } from './http-common.js';

/** Send a request; `body` (an object) goes as JSON. Resolves to `{status, headers, text}`. */
export async function send(method, url, body) {
  checkUrl(url);
  const { bytes, headers } = encodeBody(body);
  delete headers['content-length'];
  let answer;
  try {
    answer = await hostSend({ method, url, headers: Object.entries(headers), body: bytes });
  } catch (e) {
    throw hostError(e, `${method} ${url}`);
  }
  return {
    status: answer.status,
    headers: Object.fromEntries(answer.headers),
    text: new TextDecoder().decode(answer.body),
  };
}

/** The host's `error` variant (thrown as the error's payload) as a contract error. */
function hostError(error, what) {
  const code = error?.payload ?? error;
  switch (code?.tag) {
    case 'denied':
      return unauthorized(`${what}: denied by the host (not a destination this plugin may reach)`);
    case 'invalid-request':
      return invalidConfig(`${what}: ${code.val}`);
    case 'transport':
      return transient(`${what}: ${code.val}`, 2000);
    case undefined:
      return transient(`${what}: ${error?.message ?? error}`, 2000);
    default:
      return transient(`${what}: ${code.tag}`, 2000);
  }
}
