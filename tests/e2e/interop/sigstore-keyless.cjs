// Keyless signing with the real sigstore-js signer (@sigstore/sign) against
// local mock Fulcio, Rekor and timestamp services (@sigstore/mock, in-process
// through nock: nothing leaves this process). Capstan's tests run it to make
// the bundles its offline verifier must accept or refuse:
//
//   cases --out DIR (--artifact FILE | --registry HOST --repository R --digest D) --name REPO
//   verify --bundle FILE --root trusted_root.json --subject S --issuer I
//          (--artifact FILE | --registry … --repository … --digest …)
//          sigstore-js's own offline verifier (@sigstore/verify), to compare
//          its verdict with Capstan's; exit 0 when it accepts
//
// `cases` signs FILE, or the manifest at REGISTRY/R@D, and writes into DIR:
//   trusted_root.json        the mock instance's trusted root (Fulcio CA,
//                            Rekor key, CT log key, timestamp authority)
//   root-adds-ca.json        the same root plus a CA the site does not trust
//   artifact                 the bytes signed
//   good.json                a message signature over them (v0.3 bundle),
//                            signed by SUBJECT from ISSUER, logged in Rekor
//   good-dsse.json           DSSE (in-toto statement naming REPO@sha256),
//                            logged as an intoto entry
//   good-v02-timestamp.json  a v0.2 bundle with a Rekor entry and an RFC 3161
//                            timestamp
//   other-subject.json, other-issuer.json, untrusted-ca.json, tampered-proof.json,
//   expired.json (a certificate used after it expired, with no timestamp
//   inside its validity), missing-sct.json, other-digest.json: message
//   signatures like good.json, each with one thing wrong
//   identity.json            {"subject": …, "issuer": …} of good.json
'use strict';
const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const { DSSEBundleBuilder, MessageSignatureBundleBuilder, FulcioSigner, RekorWitness, TSAWitness } = require('@sigstore/sign');
const { bundleToJSON } = require('@sigstore/bundle');
const { pem } = require('@sigstore/core');
const mockLib = require('@sigstore/mock');
const { mock } = require('@sigstore/mock/dist/mock');

const FULCIO = 'https://fulcio.mock.capstan.invalid';
const REKOR = 'https://rekor.mock.capstan.invalid';
const TSA = 'https://tsa.mock.capstan.invalid';
const SUBJECT = 'https://github.com/example/plugins/.github/workflows/release.yml@refs/heads/main';
const ISSUER = 'https://token.actions.githubusercontent.com';
const COSIGN_PREDICATE = 'https://sigstore.dev/cosign/sign/v1';

function args() {
  const out = { _: process.argv[2] };
  for (let i = 3; i < process.argv.length; i += 2) out[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
  return out;
}

const b64url = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
// An OIDC token as the mock Fulcio reads it (it decodes, it does not verify).
const token = (sub, iss) => `${b64url({ alg: 'none' })}.${b64url({ sub, iss, aud: 'sigstore' })}.x`;

async function instance() {
  const key = () => crypto.generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
  const ctlog = await mockLib.initializeCTLog(key());
  const ca = await mockLib.initializeCA(key(), ctlog);
  const tlog = await mockLib.initializeTLog(REKOR, key());
  const tsa = await mockLib.initializeTSA(key());
  // A whole-second clock: sigstore-verify (Rust) reads genTime as DER
  // GeneralizedTime, without the fractions RFC 3161 permits.
  tsa.getCurrentTime = () => new Date(Math.floor(Date.now() / 1000) * 1000);
  return { ctlog, ca, tlog, tsa };
}

function trustedRoot(inst, extraCAs = []) {
  const der = (b) => Buffer.from(b).toString('base64');
  const start = '2020-01-01T00:00:00Z';
  const spkiId = (k) => crypto.createHash('sha256').update(k).digest('base64');
  const ca = (root, uri) => ({
    subject: { organization: 'sigstore.mock', commonName: 'sigstore' },
    uri,
    certChain: { certificates: [{ rawBytes: der(root) }] },
    validFor: { start },
  });
  return {
    mediaType: 'application/vnd.dev.sigstore.trustedroot+json;version=0.1',
    tlogs: [{
      baseUrl: REKOR,
      hashAlgorithm: 'SHA2_256',
      publicKey: { rawBytes: der(inst.tlog.publicKey), keyDetails: 'PKIX_ECDSA_P256_SHA_256', validFor: { start } },
      logId: { keyId: spkiId(inst.tlog.publicKey) },
    }],
    certificateAuthorities: [ca(inst.ca.rootCertificate, FULCIO), ...extraCAs.map((r, i) => ca(r, `${FULCIO}/extra-${i}`))],
    ctlogs: [{
      baseUrl: 'https://ctfe.mock.capstan.invalid',
      hashAlgorithm: 'SHA2_256',
      publicKey: { rawBytes: der(inst.ctlog.publicKey), keyDetails: 'PKIX_ECDSA_P256_SHA_256', validFor: { start } },
      logId: { keyId: der(inst.ctlog.logID) },
    }],
    timestampAuthorities: [{
      subject: { organization: 'sigstore.mock', commonName: 'sigstore-tsa' },
      uri: TSA,
      certChain: { certificates: [{ rawBytes: der(inst.tsa.intCertificate) }, { rawBytes: der(inst.tsa.rootCertificate) }] },
      validFor: { start },
    }],
  };
}

// The mock Fulcio writes each certificate's PEM as one base64 line; real
// Fulcio (Go's encoding/pem) wraps at 64 columns, and the signer copies the
// PEM into the Rekor entry, where sigstore-python compares it with its own
// encoding. Re-wrapped here, so the entries are what real Fulcio would yield.
function fulcio(ca) {
  const handler = mockLib.fulcioHandler(ca);
  return {
    path: handler.path,
    fn: async (body) => {
      const reply = await handler.fn(body);
      if (reply.statusCode !== 201) return reply;
      const json = JSON.parse(reply.response);
      const chain = json.signedCertificateEmbeddedSct.chain;
      chain.certificates = chain.certificates.map((p) => pem.fromDER(pem.toDER(p)));
      return { ...reply, response: JSON.stringify(json) };
    },
  };
}

// One signature: each mocked service answers one request, so they are
// armed again for every bundle.
async function sign(inst, { data, name, sub = SUBJECT, iss = ISSUER, dsse = false, v02 = false, timestamp = false, ca = inst.ca }) {
  mock(FULCIO, fulcio(ca));
  mock(REKOR, mockLib.rekorHandler(inst.tlog));
  if (timestamp) mock(TSA, mockLib.tsaHandler(inst.tsa));
  const signer = new FulcioSigner({ fulcioBaseURL: FULCIO, identityProvider: { getToken: async () => token(sub, iss) } });
  // DSSE is logged as an intoto entry: the mock logs what it is sent, and
  // only for intoto is that the shape real Rekor stores.
  const witnesses = [new RekorWitness({ rekorBaseURL: REKOR, fetchOnConflict: false, entryType: dsse ? 'intoto' : undefined })];
  if (timestamp) witnesses.push(new TSAWitness({ tsaBaseURL: TSA }));
  if (!dsse) {
    const builder = new MessageSignatureBundleBuilder({ signer, witnesses, singleCertificate: !v02 });
    return bundleToJSON(await builder.create({ data }));
  }
  const digest = crypto.createHash('sha256').update(data).digest('hex');
  const statement = {
    _type: 'https://in-toto.io/Statement/v1',
    subject: [{ name, digest: { sha256: digest } }],
    predicateType: COSIGN_PREDICATE,
    predicate: {},
  };
  const builder = new DSSEBundleBuilder({ signer, witnesses, singleCertificate: true });
  const bundle = await builder.create({ data: Buffer.from(JSON.stringify(statement)), type: 'application/vnd.in-toto+json' });
  return bundleToJSON(bundle);
}

// The bytes a signature covers: a file, or an OCI manifest as stored.
async function artifact(a) {
  if (a.artifact) return fs.readFileSync(a.artifact);
  const res = await fetch(`http://${a.registry}/v2/${a.repository}/manifests/${a.digest}`, {
    headers: { Accept: 'application/vnd.oci.image.manifest.v1+json' },
  });
  if (!res.ok) throw new Error(`manifest ${a.digest}: HTTP ${res.status}`);
  return Buffer.from(await res.arrayBuffer());
}

async function verify(a) {
  const { Verifier, toSignedEntity, toTrustMaterial } = require('@sigstore/verify');
  const { bundleFromJSON } = require('@sigstore/bundle');
  const { TrustedRoot } = require('@sigstore/protobuf-specs');
  const root = TrustedRoot.fromJSON(JSON.parse(fs.readFileSync(a.root, 'utf8')));
  const verifier = new Verifier(toTrustMaterial(root), { tlogThreshold: 1, ctlogThreshold: 1, timestampThreshold: 1 });
  const bundle = bundleFromJSON(JSON.parse(fs.readFileSync(a.bundle, 'utf8')));
  const data = await artifact(a);
  const dsse = bundle.content.$case === 'dsseEnvelope';
  if (dsse) {
    // sigstore-js checks the envelope; the statement's subject is ours to bind.
    const statement = JSON.parse(Buffer.from(bundle.content.dsseEnvelope.payload).toString('utf8'));
    const digest = crypto.createHash('sha256').update(data).digest('hex');
    if (!statement.subject.some((s) => s.digest.sha256 === digest)) throw new Error('the statement does not name the artifact');
  }
  verifier.verify(toSignedEntity(bundle, dsse ? undefined : data), {
    subjectAlternativeName: a.subject,
    extensions: { issuer: a.issuer },
  });
  console.log('verified by sigstore-js');
}

async function cases(a) {
  const out = a.out;
  fs.mkdirSync(out, { recursive: true });
  const data = await artifact(a);
  const name = a.name;
  const inst = await instance();
  const stranger = await instance();
  const write = (file, value) => fs.writeFileSync(path.join(out, file), JSON.stringify(value, null, 2));
  write('trusted_root.json', trustedRoot(inst));
  write('root-adds-ca.json', trustedRoot(inst, [stranger.ca.rootCertificate]));
  write('identity.json', { subject: SUBJECT, issuer: ISSUER });
  fs.writeFileSync(path.join(out, 'artifact'), data);
  const good = await sign(inst, { data, name });
  write('good.json', good);
  write('good-dsse.json', await sign(inst, { data, name, dsse: true }));
  write('good-v02-timestamp.json', await sign(inst, { data, name, v02: true, timestamp: true }));
  write('other-subject.json', await sign(inst, { data, name, sub: 'https://github.com/mallory/plugins/.github/workflows/release.yml@refs/heads/main' }));
  write('other-issuer.json', await sign(inst, { data, name, iss: 'https://accounts.example.com' }));
  // The same Rekor and CT log, but a certificate from a CA the root lacks.
  const foreign = await mockLib.initializeCA(crypto.generateKeyPairSync('ec', { namedCurve: 'prime256v1' }), inst.ctlog);
  write('untrusted-ca.json', await sign(inst, { data, name, ca: foreign }));
  const tampered = JSON.parse(JSON.stringify(good));
  const proof = tampered.verificationMaterial.tlogEntries[0].inclusionProof;
  const root = Buffer.from(proof.rootHash, 'base64');
  root[0] ^= 0xff;
  proof.rootHash = root.toString('base64');
  write('tampered-proof.json', tampered);
  // A certificate issued an hour ago (valid ten minutes) and logged now.
  const past = new Date(Date.now() - 60 * 60 * 1000);
  const ca = inst.ca;
  const now = ca.getCurrentTime;
  ca.getCurrentTime = () => past;
  write('expired.json', await sign(inst, { data, name }));
  ca.getCurrentTime = now;
  // A certificate with no SCT: the CA skips the CT log.
  const ctLog = ca.ctLog;
  ca.ctLog = undefined;
  write('missing-sct.json', await sign(inst, { data, name }));
  ca.ctLog = ctLog;
  write('other-digest.json', await sign(inst, { data: Buffer.concat([data, Buffer.from('tampered')]), name }));
  console.log(`wrote keyless cases into ${out}`);
}

const a = args();
const commands = { cases, verify };
if (!commands[a._]) {
  console.error('usage: sigstore-keyless.cjs cases|verify … (see the comment at the top)');
  process.exit(2);
}
commands[a._](a).catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});
