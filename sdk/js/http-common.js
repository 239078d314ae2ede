// What both transports share: the URL check, the body's framing, and how
// failures and answers become contract errors (as the Rust SDK maps them).
import { invalidConfig, notFound, terminal, transient, unauthorized } from './index.js';

/** `url` must be absolute http(s); anything else is the config's fault. */
export function checkUrl(url) {
  if (!/^https?:\/\/[^/?#]+/.test(url)) {
    throw invalidConfig(`endpoint: \`${url}\` is not an http:// or https:// URL`);
  }
}

/** `body` (an object, or undefined for none) as JSON bytes and its headers. */
export function encodeBody(body) {
  const text = body === undefined ? '' : JSON.stringify(body);
  const bytes = new TextEncoder().encode(text);
  const headers = { 'content-length': String(bytes.length) };
  if (body !== undefined) headers['content-type'] = 'application/json';
  return { bytes, headers };
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
