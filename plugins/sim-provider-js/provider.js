// `sim-provider-js`: the sim cloud's provider (plugins/sim-provider) in
// JavaScript. One instance per Machine, created idempotently with the
// Machine's uid as the client token, tagged with the Machine and cluster;
// `get` finds it by provider ID or by client token; `delete` is done once
// the cloud has no instance. Exports are async: `fetch` goes through
// wasi:http, where the host checks the destination and adds the credential.
import { invalidConfig, notFound, parseConfig, terminal, toBase64 } from '@capstan/plugin';
import { apiError, send } from '@capstan/plugin/http';

export const INSTANCE_TYPES = ['small', 'medium', 'large'];
const PREFIX = 'sim://';
const STATES = { pending: 'pending', running: 'running', updating: 'updating', terminating: 'stopping', stopped: 'stopped' };
const CONFIG = {
  endpoint: { type: 'string', required: true },
  instanceType: { type: 'string', oneOf: INSTANCE_TYPES },
  tags: { type: 'object', values: 'string', default: {} },
};

function parse(text) {
  const config = parseConfig(text, CONFIG, 'provider config');
  if (!/^https?:\/\//.test(config.endpoint)) {
    throw invalidConfig(`endpoint: \`${config.endpoint}\` must be an http:// or https:// URL`);
  }
  const reserved = Object.keys(config.tags).find((k) => k.startsWith('capstan.dev/'));
  if (reserved) {
    throw invalidConfig(`tags: \`${reserved}\` is reserved (keys under capstan.dev/ are set by the provider)`);
  }
  return config;
}

const url = (config, path) => config.endpoint.replace(/\/+$/, '') + path;

export function instanceId(providerId) {
  const id = providerId.startsWith(PREFIX) ? providerId.slice(PREFIX.length) : '';
  if (!id || /[/?#]/.test(id)) throw terminal(`provider ID \`${providerId}\` is not a ${PREFIX}<instance-id> ID`);
  return id;
}

/** An instance of the cloud's API as the contract's machine-status. */
export function status(instance) {
  const addresses = [];
  if (instance.privateIp) addresses.push({ kind: 'internal-ip', address: instance.privateIp });
  if (instance.hostname) addresses.push({ kind: 'hostname', address: instance.hostname });
  const update = instance.update;
  return {
    providerId: PREFIX + instance.id,
    state: STATES[instance.state] ?? 'unknown',
    addresses,
    failureDomain: instance.failureDomain ?? undefined,
    version: instance.version ?? undefined,
    message: update ? `updating to ${update.targetVersion} (${update.percent}%)` : undefined,
  };
}

function json(answer) {
  try {
    return JSON.parse(answer.text);
  } catch (e) {
    throw terminal(`the cloud's answer is not JSON: ${e.message}`);
  }
}

async function find(machine, config) {
  if (machine.providerId) {
    const answer = await send('GET', url(config, `/v1/instances/${instanceId(machine.providerId)}`));
    if (answer.status === 200) return json(answer);
    if (answer.status === 404) return undefined;
    throw apiError(answer, 'describing the instance');
  }
  const answer = await send('GET', url(config, `/v1/instances?clientToken=${machine.uid}`));
  if (answer.status === 200) return json(answer).instances?.[0];
  throw apiError(answer, 'looking up the instance by machine uid');
}

export const provider = {
  async validate(config) {
    parse(config);
  },
  async create(machine, bootstrap) {
    const config = parse(machine.providerConfig);
    const tags = { ...config.tags, 'capstan.dev/machine': `${machine.namespace}/${machine.name}` };
    if (machine.clusterName) tags['capstan.dev/cluster'] = machine.clusterName;
    const body = {
      clientToken: machine.uid,
      name: machine.name,
      version: machine.version ?? null,
      instanceType: config.instanceType ?? null,
      failureDomain: machine.failureDomain ?? null,
      tags: Object.fromEntries(Object.entries(tags).sort()),
    };
    if (bootstrap) {
      const format = { 'cloud-config': 'cloud-config', ignition: 'ignition', shell: 'shell' }[bootstrap.format];
      body.userData = { format, value: toBase64(bootstrap.value) };
    }
    const answer = await send('POST', url(config, '/v1/instances'), body);
    if (answer.status === 200 || answer.status === 201) return status(json(answer));
    throw apiError(answer, 'creating the instance');
  },
  async get(machine) {
    const instance = await find(machine, parse(machine.providerConfig));
    if (!instance) throw notFound(`no instance for machine ${machine.namespace}/${machine.name} (uid ${machine.uid})`);
    return status(instance);
  },
  async delete(machine) {
    const config = parse(machine.providerConfig);
    const instance = await find(machine, config);
    if (!instance) return { tag: 'done' };
    const answer = await send('DELETE', url(config, `/v1/instances/${instance.id}`));
    if (answer.status === 404) return { tag: 'done' };
    if (answer.status === 200 || answer.status === 202) return { tag: 'in-progress', val: 250n };
    throw apiError(answer, 'deleting the instance');
  },
  async findInstance(machine) {
    const config = parse(machine.providerConfig);
    let instance;
    if (machine.providerId) {
      instance = await find(machine, config);
    } else {
      const owner = `${machine.namespace}/${machine.name}`;
      const answer = await send('GET', url(config, `/v1/instances?tagKey=capstan.dev/machine&tagValue=${owner}`));
      if (answer.status !== 200) throw apiError(answer, 'looking up instances by machine tag');
      instance = (json(answer).instances ?? []).find(
        (i) => i.tags?.['capstan.dev/machine'] === owner && i.state !== 'terminating',
      );
    }
    if (!instance || instance.state === 'terminating') return undefined;
    return {
      status: status(instance),
      machine: instance.tags?.['capstan.dev/machine'],
      cluster: instance.tags?.['capstan.dev/cluster'],
    };
  },
  async capacity(text) {
    const config = parse(text);
    const answer = await send('GET', url(config, `/v1/instance-types/${config.instanceType ?? 'small'}`));
    if (answer.status === 404) return undefined;
    if (answer.status !== 200) throw apiError(answer, 'describing the instance type');
    const t = json(answer);
    return {
      cpuMillis: t.cpus * 1000,
      memoryMib: BigInt(t.memoryMiB),
      ephemeralDiskMib: t.ephemeralDiskMiB === undefined ? undefined : BigInt(t.ephemeralDiskMiB),
      maxPods: t.maxPods,
      gpuCount: undefined,
      gpuType: undefined,
    };
  },
  async listInstances(config) {
    const answer = await send('GET', url(parse(config), '/v1/instances'));
    if (answer.status === 200) return (json(answer).instances ?? []).map(status);
    throw apiError(answer, 'listing instances');
  },
};
