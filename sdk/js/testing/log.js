// Stand-in for `capstan:plugin/log@0.1.0` on Node: records each call.
export function log(level, message, fields) {
  globalThis.capstanLogs.push({ level, message, fields });
}
