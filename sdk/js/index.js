// The Capstan plugin SDK for JavaScript (componentize-js).
//
// A JavaScript plugin is a WebAssembly component: componentize-js builds it
// from your module and a contract world (`wit/`, `capstan:plugin@0.3.0`:
// `addon-plugin`, `provider-plugin`, `updater-plugin`), then `capstan
// plugin annotate` embeds your `capstan-plugin.json`. This module is pure
// (it imports no WIT interface), so it runs and is tested on Node; logging,
// which needs the host, is in `@capstan/plugin/log`, and HTTP in
// `@capstan/plugin/http` (capstan:plugin/http, 0.3.0 hosts) or
// `@capstan/plugin/http-fetch` (fetch over wasi:http, any host).

/** A contract error to `throw` from an export that returns `result`. */
export class PluginError extends Error {
  constructor(tag, val) {
    super(typeof val === 'string' ? val : val.message);
    this.name = 'PluginError';
    // componentize-js returns `payload` as the export's `err` value.
    this.payload = { tag, val };
  }
}

/** The configuration is wrong; name the field and what is wrong with it. */
export const invalidConfig = (message) => new PluginError('invalid-config', message);
/** The thing asked about does not exist. */
export const notFound = (message) => new PluginError('not-found', message);
/** Retry later; the host waits `retryAfterMs`. */
export const transient = (message, retryAfterMs = 1000) =>
  new PluginError('transient', { message, retryAfterMs: BigInt(Math.max(1, Math.floor(retryAfterMs))) });
/** The plugin's credentials were refused. */
export const unauthorized = (message) => new PluginError('unauthorized', message);
/** A failure retrying will not fix; a human must look. */
export const terminal = (message) => new PluginError('terminal', message);

function kind(value) {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  switch (typeof value) {
    case 'string': return 'a string';
    case 'number': return 'a number';
    case 'boolean': return 'a boolean';
    default: return 'an object';
  }
}

const TYPES = {
  string: (v) => typeof v === 'string',
  boolean: (v) => typeof v === 'boolean',
  integer: (v) => Number.isInteger(v),
  number: (v) => typeof v === 'number' && Number.isFinite(v),
  object: (v) => v !== null && typeof v === 'object' && !Array.isArray(v),
  array: (v) => Array.isArray(v),
};
const ARTICLE = { integer: 'an integer', object: 'an object', array: 'an array' };

/**
 * Check decoded JSON against `schema` ({field: {type, default?, required?,
 * min?, max?, oneOf?, values?}}) and fill defaults. Throws `invalid-config`
 * naming the field: `port: expected an integer, got a string`.
 */
export function checkConfig(value, schema, path = '') {
  if (!TYPES.object(value)) {
    throw invalidConfig(`${path || 'config'}: expected an object, got ${kind(value)}`);
  }
  const known = Object.keys(schema);
  const unknown = Object.keys(value).filter((k) => !known.includes(k)).sort();
  if (unknown.length > 0) {
    throw invalidConfig(`${path}${unknown[0]}: unknown field; expected one of ${[...known].sort().join(', ')}`);
  }
  const out = {};
  for (const [key, rule] of Object.entries(schema)) {
    const at = `${path}${key}`;
    if (!(key in value) || value[key] === undefined) {
      if (rule.required) throw invalidConfig(`${at}: missing (it is required)`);
      if ('default' in rule) out[key] = structuredClone(rule.default);
      continue;
    }
    const v = value[key];
    if (v === null && rule.nullable) {
      out[key] = null;
      continue;
    }
    if (!TYPES[rule.type](v)) {
      throw invalidConfig(`${at}: expected ${ARTICLE[rule.type] ?? `a ${rule.type}`}, got ${kind(v)}`);
    }
    if (rule.min !== undefined && v < rule.min) throw invalidConfig(`${at}: ${v} is below the minimum of ${rule.min}`);
    if (rule.max !== undefined && v > rule.max) throw invalidConfig(`${at}: ${v} is above the maximum of ${rule.max}`);
    if (rule.oneOf && !rule.oneOf.includes(v)) {
      throw invalidConfig(`${at}: ${JSON.stringify(v)} is not one of ${rule.oneOf.join(', ')}`);
    }
    if (rule.type === 'object' && rule.fields) {
      out[key] = checkConfig(v, rule.fields, `${at}.`);
    } else if (rule.type === 'object' && rule.values) {
      for (const [k, inner] of Object.entries(v)) {
        if (!TYPES[rule.values](inner)) {
          throw invalidConfig(`${at}.${k}: expected ${ARTICLE[rule.values] ?? `a ${rule.values}`}, got ${kind(inner)}`);
        }
      }
      out[key] = v;
    } else {
      out[key] = v;
    }
  }
  return out;
}

/** Parse JSON object text (the Addon's or Machine's config) against `schema`. */
export function parseConfig(text, schema, what = 'config') {
  let value;
  try {
    value = text.trim() === '' ? {} : JSON.parse(text);
  } catch (e) {
    throw invalidConfig(`${what} is not valid JSON: ${e.message}`);
  }
  try {
    return checkConfig(value, schema);
  } catch (e) {
    if (e instanceof PluginError) throw invalidConfig(`${what} is invalid: ${e.message}`);
    throw e;
  }
}

const B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';

/** Standard base64 of bytes (bootstrap data as user data); no Node or browser globals needed. */
export function toBase64(bytes) {
  let out = '';
  for (let i = 0; i < bytes.length; i += 3) {
    const n = (bytes[i] << 16) | ((bytes[i + 1] ?? 0) << 8) | (bytes[i + 2] ?? 0);
    out += B64[(n >> 18) & 63] + B64[(n >> 12) & 63];
    out += i + 1 < bytes.length ? B64[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.length ? B64[n & 63] : '=';
  }
  return out;
}

/** An updater's `update` answer: every claimed field is applied. */
export const updateDone = () => ({ tag: 'done' });
/**
 * An updater's `update` answer: still working; the host calls `update` again
 * after `retryAfterMs` (at least 1). `percent` (0-100) and `message` show in
 * the Machine's status.
 */
export function updateInProgress(retryAfterMs = 1000, percent, message) {
  return {
    tag: 'in-progress',
    val: {
      retryAfterMs: BigInt(Math.max(1, Math.floor(retryAfterMs))),
      percent: Number.isFinite(percent) ? Math.min(100, Math.max(0, Math.round(percent))) : undefined,
      message,
    },
  };
}
/** An updater's `update` answer: the update failed; the host reports it and never rolls back silently. */
export const updateFailed = (message) => ({ tag: 'failed', val: message });

/**
 * `[[version, channel], ...]` as the `versions` export returns it. `kubernetes`
 * (optional) maps a version to the Kubernetes versions it supports, as a
 * semantic-version requirement such as `'>=1.20.0'`: the host applies a version
 * only while the cluster's API server and kubelets meet it.
 */
export function versionTable(table, kubernetes = {}) {
  const out = [];
  for (const [version, channel] of table) {
    const entry = out.find((v) => v.version === version);
    if (entry) entry.channels.push(channel);
    else if (kubernetes[version] !== undefined) out.push({ version, channels: [channel], kubernetes: kubernetes[version] });
    else out.push({ version, channels: [channel] });
  }
  return out;
}

/** The version the host resolved (`spec.version`), or `invalid-config` naming the known ones. */
export function pickVersion(spec, table) {
  const asked = spec.version ?? '';
  const known = [...new Set(table.map(([v]) => v))];
  if (!known.includes(asked)) {
    throw invalidConfig(`version: ${JSON.stringify(asked)} is not one of ${known.join(', ')}`);
  }
  return asked;
}

/** The observed object of `kind` named `name`, parsed; undefined when absent or not JSON. */
export function findObserved(observed, kindName, name) {
  for (const text of observed) {
    try {
      const v = JSON.parse(text);
      if (v?.kind === kindName && v?.metadata?.name === name) return v;
    } catch {
      // not JSON: not the object asked for
    }
  }
  return undefined;
}

const count = (v, path) => {
  let at = v;
  for (const key of path) at = at?.[key];
  return Number.isInteger(at) ? at : 0;
};
const rolledOut = (v) => count(v, ['status', 'observedGeneration']) >= count(v, ['metadata', 'generation']);
const health = (healthy, message, details) => ({ healthy, message, details });

/** A Deployment is healthy when its latest spec is rolled out and every desired replica is updated and available. */
export function deploymentHealth(d, name) {
  if (!d) return health(false, `Deployment ${name} is not there`, []);
  const desired = Number.isInteger(d?.spec?.replicas) ? d.spec.replicas : 1;
  const updated = count(d, ['status', 'updatedReplicas']);
  const available = count(d, ['status', 'availableReplicas']);
  const details = [
    ['availableReplicas', `${available}/${desired}`],
    ['updatedReplicas', `${updated}/${desired}`],
  ];
  if (!rolledOut(d)) return health(false, `Deployment ${name}: the latest spec is not rolled out yet`, details);
  const healthy = updated >= desired && available >= desired;
  return health(
    healthy,
    healthy
      ? `Deployment ${name}: ${available}/${desired} replicas available`
      : `Deployment ${name}: ${updated}/${desired} updated, ${available}/${desired} available`,
    details,
  );
}

/** A DaemonSet is healthy when its latest spec is rolled out and every Node that should run it runs an updated, ready pod. */
export function daemonsetHealth(d, name) {
  if (!d) return health(false, `DaemonSet ${name} is not there`, []);
  const desired = count(d, ['status', 'desiredNumberScheduled']);
  const ready = count(d, ['status', 'numberReady']);
  const updated = count(d, ['status', 'updatedNumberScheduled']);
  const details = [
    ['numberReady', `${ready}/${desired}`],
    ['updatedNumberScheduled', `${updated}/${desired}`],
  ];
  if (!rolledOut(d)) return health(false, `DaemonSet ${name}: the latest spec is not rolled out yet`, details);
  return health(
    ready >= desired && updated >= desired,
    `DaemonSet ${name}: ${ready}/${desired} ready, ${updated}/${desired} updated`,
    details,
  );
}
