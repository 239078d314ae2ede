// Outbound HTTP from a JavaScript plugin: `fetch` (componentize-js sends it
// through wasi:http, where the host lets through only destinations the
// manifest declares and an admin grants, and attaches the credential
// itself: never put one in a request). These helpers frame every request
// with an exact `content-length`, read the whole answer, and map failures
// and non-2xx answers to contract errors as the Rust SDK does.
import { invalidConfig, notFound, terminal, transient, unauthorized } from './index.js';

/** Send a request; `body` (an object) goes as JSON. Resolves to `{status, headers, text}`. */
export async function send(method, url, body) {
  if (!/^https?:\/\/[^/?#]+/.test(url)) {
    throw invalidConfig(`endpoint: \`${url}\` is not an http:// or https:// URL`);
  }
  const text = body === undefined ? '' : JSON.stringify(body);
  const bytes = new TextEncoder().encode(text);
  const headers = { 'content-length': String(bytes.length) };
  if (body !== undefined) headers['content-type'] = 'application/json';
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

/** A request that got no answer, as a contract error: a refused destination is unauthorized, anything else transient. */
export function toPluginError(error, what) {
  const message = `${what}: ${error?.message ?? error}`;
  return /denied/i.test(message) ? unauthorized(message) : transient(message, 2000);
}

/**
 * A non-success answer as a contract error, by status: 401/403
 * unauthorized, 404 not-found, 429 transient after `retry-after`, 503
 * transient after 5 s, other 5xx after 1 s, 400/422 invalid-config, the rest
 * terminal. The message quotes the API's `code: message` when it is JSON.
 */
export function apiError(response, doing) {
  let detail;
  try {
    const body = JSON.parse(response.text);
    detail = `${body.code ?? 'Unknown'}: ${body.message ?? ''}`;
  } catch {
    detail = response.text.slice(0, 200);
  }
  const message = `${doing}: HTTP ${response.status} ${detail}`;
  const status = response.status;
  if (status === 401 || status === 403) return unauthorized(message);
  if (status === 404) return notFound(message);
  if (status === 429) {
    const seconds = Number.parseInt(response.headers['retry-after'] ?? '1', 10);
    return transient(message, (Number.isFinite(seconds) ? seconds : 1) * 1000);
  }
  if (status === 503) return transient(message, 5000);
  if (status >= 500 && status <= 599) return transient(message, 1000);
  if (status === 400 || status === 422) return invalidConfig(message);
  return terminal(message);
}
