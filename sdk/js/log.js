// Structured logs into the host's logs, tagged with the plugin and call:
// `info('rendered', { objects: 4 })`. Volume is limited per call;
// console.log also works (stdout is captured) but loses the fields.
import { log } from 'capstan:plugin/log@0.1.0';

const emit = (level) => (message, fields = {}) =>
  log(level, String(message), Object.entries(fields).map(([k, v]) => [String(k), String(v)]));

export const trace = emit('trace');
export const debug = emit('debug');
export const info = emit('info');
export const warn = emit('warn');
export const error = emit('error');
