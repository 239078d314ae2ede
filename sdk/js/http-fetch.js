// Outbound HTTP through `fetch` (componentize-js sends it through
// wasi:http): runs on hosts of every contract version. On a 0.3.0 host,
// `@capstan/plugin/http` does the same in one host call per request. The
// host lets through only destinations the manifest declares and an admin
// grants, and attaches the credential itself: never put one in a request.
// Every request is framed with an exact `content-length`.
import { checkUrl, encodeBody, toPluginError } from './http-common.js';

export { apiError, toPluginError } from './http-common.js';

/** Send a request; `body` (an object) goes as JSON. Resolves to `{status, headers, text}`. */
export async function send(method, url, body) {
  checkUrl(url);
  const { bytes, headers } = encodeBody(body);
  let response;
  try {
    response = await fetch(url, { method, headers, body: body === undefined ? undefined : bytes });
  } catch (e) {
    throw toPluginError(e, `${method} ${url}`);
  }
  return {
    status: response.status,
    headers: Object.fromEntries(response.headers.entries()),
    text: await response.text(),
  };
}
