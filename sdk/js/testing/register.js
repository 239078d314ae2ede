// Run a plugin's modules on Node: `node --import @capstan/plugin/testing
// --test`. WIT imports (`capstan:plugin/log@0.1.0`) exist only inside the
// component; here they resolve to stand-ins, and what the plugin logged is
// kept in `globalThis.capstanLogs` for tests to read.
import { register } from 'node:module';

globalThis.capstanLogs = [];
register(new URL('./hooks.js', import.meta.url));
