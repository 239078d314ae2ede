// Types of @capstan/plugin (see index.js).

export type ErrorTag = 'invalid-config' | 'not-found' | 'transient' | 'unauthorized' | 'terminal';
export class PluginError extends Error {
  constructor(tag: ErrorTag, val: string | { message: string; retryAfterMs: bigint });
  payload: { tag: ErrorTag; val: string | { message: string; retryAfterMs: bigint } };
}
export function invalidConfig(message: string): PluginError;
export function notFound(message: string): PluginError;
export function transient(message: string, retryAfterMs?: number): PluginError;
export function unauthorized(message: string): PluginError;
export function terminal(message: string): PluginError;

export type FieldType = 'string' | 'boolean' | 'integer' | 'number' | 'object' | 'array';
export interface FieldRule {
  type: FieldType;
  default?: unknown;
  required?: boolean;
  nullable?: boolean;
  min?: number;
  max?: number;
  oneOf?: unknown[];
  /** For `object`: the nested schema. */
  fields?: Schema;
  /** For `object` used as a map: the type of every value. */
  values?: FieldType;
}
export type Schema = Record<string, FieldRule>;
export function checkConfig(value: unknown, schema: Schema, path?: string): Record<string, any>;
export function parseConfig(text: string, schema: Schema, what?: string): Record<string, any>;

export interface AddonSpec {
  name: string;
  namespace: string;
  version?: string;
  channel?: string;
  config: string;
  /** The target cluster's Kubernetes version (`v1.30.2`), when the host knows it. */
  kubernetesVersion?: string;
}
export interface VersionInfo { version: string; channels: string[]; kubernetes?: string }
export interface Health { healthy: boolean; message?: string; details: [string, string][] }
export type UpdateProgress =
  | { tag: 'done' }
  | { tag: 'in-progress'; val: { retryAfterMs: bigint; percent?: number; message?: string } }
  | { tag: 'failed'; val: string };
export function updateDone(): UpdateProgress;
export function updateInProgress(retryAfterMs?: number, percent?: number, message?: string): UpdateProgress;
export function updateFailed(message: string): UpdateProgress;
export function toBase64(bytes: Uint8Array): string;
export function versionTable(table: [string, string][], kubernetes?: Record<string, string>): VersionInfo[];
export function pickVersion(spec: AddonSpec, table: [string, string][]): string;
export function findObserved(observed: string[], kind: string, name: string): any | undefined;
export function deploymentHealth(observed: any | undefined, name: string): Health;
export function daemonsetHealth(observed: any | undefined, name: string): Health;

// @capstan/plugin/http (capstan:plugin/http) and @capstan/plugin/http-fetch (fetch): the same functions
export interface HttpAnswer { status: number; headers: Record<string, string>; text: string }
