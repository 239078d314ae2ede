// Module resolution hooks (see register.js): WIT interfaces resolve to the
// stand-ins in this folder.
const STANDINS = {
  'capstan:plugin/log@0.1.0': new URL('./log.js', import.meta.url).href,
  'capstan:plugin/http@0.3.0': new URL('./http.js', import.meta.url).href,
};

export async function resolve(specifier, context, next) {
  const standin = STANDINS[specifier];
  if (standin) return { url: standin, shortCircuit: true };
  if (/^[a-z][a-z0-9-]*:[a-z][a-z0-9-]*\//.test(specifier) && !specifier.startsWith('node:')) {
    throw new Error(`${specifier}: no stand-in for this WIT interface on Node (@capstan/plugin/testing has: ${Object.keys(STANDINS).join(', ')})`);
  }
  return next(specifier, context);
}
