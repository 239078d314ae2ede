// `sim-updater-js`: the sim cloud's in-place updater (plugins/sim-updater)
// in JavaScript. It claims one field, `version`, and applies it with the
// cloud's in-place update API. `update` is re-entrant: every call looks at
// the instance first, so calling it again (also after a host restart)
// continues or confirms the same update instead of starting a new one.
// Exports are async: `fetch` goes through wasi:http, where the host checks
// the destination and adds the credential.
import { invalidConfig, parseConfig, terminal, transient, updateDone, updateFailed, updateInProgress } from '@capstan/plugin';
import { apiError, send } from '@capstan/plugin/http';

/** The field this updater changes in place. */
export const VERSION_FIELD = 'version';
const PREFIX = 'sim://';
// The provider's config; the updater needs `endpoint`.
const CONFIG = {
  endpoint: { type: 'string', required: true },
  instanceType: { type: 'string' },
  tags: { type: 'object', values: 'string', default: {} },
};

export function instanceId(providerId) {
  const id = providerId?.startsWith(PREFIX) ? providerId.slice(PREFIX.length) : '';
  if (!id || /[/?#]/.test(id)) throw terminal(`the machine has no ${PREFIX} provider ID yet (it has \`${providerId ?? ''}\`)`);
  return id;
}

/** What `update` answers from the instance alone; undefined when the update must be started. */
export function progress(instance, target) {
  if (instance.state === 'terminating') return updateFailed('the instance is being deleted');
  const underWay = instance.update;
  if (underWay && underWay.targetVersion === target) return updateInProgress(200, underWay.percent, `updating to ${target}`);
  if (!underWay && instance.version === target) return updateDone();
  return undefined;
}

export const updater = {
  canUpdate(_current, _desired, changedFields) {
    return changedFields.filter((f) => f === VERSION_FIELD);
  },
  async update(current, desired, claimedFields) {
    if (!claimedFields.includes(VERSION_FIELD)) return updateDone();
    const config = parseConfig(desired.providerConfig, CONFIG, 'provider config');
    const target = desired.version;
    if (!target) throw invalidConfig('version: the desired machine has no version');
    const url = `${config.endpoint.replace(/\/+$/, '')}/v1/instances/${instanceId(current.providerId)}`;
    const answer = await send('GET', url);
    if (answer.status !== 200) throw apiError(answer, 'describing the instance');
    let instance;
    try {
      instance = JSON.parse(answer.text);
    } catch (e) {
      throw transient(`the cloud's answer is not JSON: ${e.message}`, 1000);
    }
    const known = progress(instance, target);
    if (known) return known;
    const started = await send('POST', `${url}/update`, { version: target });
    if (started.status === 202) return updateInProgress(200, 0, `update to ${target} started`);
    if (started.status === 409) return updateFailed(`the cloud refused the update: ${started.text}`);
    throw apiError(started, 'starting the update');
  },
};
