// Interoperability driver for sigstore-js, an independent Sigstore
// implementation (npm @sigstore/sign, @sigstore/verify, @sigstore/bundle).
// Capstan's tests run it to check both directions:
//
//   genkey  --out-prefix P                      P.pem (PKCS#8) + P.pub (SPKI)
//   sign    --key P.pem --name REPO --digest D --out FILE
//           DSSE bundle (in-toto statement naming REPO@D) signed by sigstore-js
//   verify-registry --registry HOST --repository REPO --digest D --pub FILE
//           fetch Capstan's cosign .sig layers and Sigstore bundle referrers
//           straight from the registry and verify them with sigstore-js
//
// Keyed verification: no transparency log or timestamp authority is reachable
// here, so the verifier runs with tlog/ctlog/timestamp thresholds of 0 and a
// key finder that returns the given public key.
'use strict';
const crypto = require('crypto');
const fs = require('fs');
const { DSSEBundleBuilder } = require('@sigstore/sign');
const { bundleFromJSON, bundleToJSON } = require('@sigstore/bundle');
const { Verifier, toSignedEntity, toTrustMaterial } = require('@sigstore/verify');

function args() {
  const out = { _: process.argv[2] };
  for (let i = 3; i < process.argv.length; i += 2) out[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
  return out;
}

function verifier(pubPem) {
  const publicKey = crypto.createPublicKey(pubPem);
  const root = { certificateAuthorities: [], timestampAuthorities: [], tlogs: [], ctlogs: [] };
  const material = toTrustMaterial(root, () => ({ publicKey, validFor: () => true }));
  return new Verifier(material, { tlogThreshold: 0, ctlogThreshold: 0, timestampThreshold: 0 });
}

async function fetchOk(url, accept) {
  const res = await fetch(url, { headers: accept ? { Accept: accept } : {} });
  return res;
}

async function verifyRegistry(a) {
  const base = `http://${a.registry}/v2/${a.repository}`;
  const hex = a.digest.replace('sha256:', '');
  const v = verifier(fs.readFileSync(a.pub, 'utf8'));
  let verified = 0;

  // cosign .sig: each layer is a simple-signing payload, the signature in an
  // annotation. sigstore-js verifies it as a message signature over the payload.
  const sig = await fetchOk(`${base}/manifests/sha256-${hex}.sig`, 'application/vnd.oci.image.manifest.v1+json');
  if (sig.ok) {
    const manifest = await sig.json();
    for (const layer of manifest.layers) {
      const payload = Buffer.from(await (await fetchOk(`${base}/blobs/${layer.digest}`)).arrayBuffer());
      const claims = JSON.parse(payload.toString('utf8'));
      if (claims.critical.image['docker-manifest-digest'] !== a.digest) throw new Error(`payload names ${claims.critical.image['docker-manifest-digest']}`);
      const bundle = bundleFromJSON({
        mediaType: 'application/vnd.dev.sigstore.bundle.v0.3+json',
        verificationMaterial: { publicKey: { hint: 'capstan' }, tlogEntries: [], timestampVerificationData: { rfc3161Timestamps: [] } },
        messageSignature: {
          messageDigest: { algorithm: 'SHA2_256', digest: crypto.createHash('sha256').update(payload).digest('base64') },
          signature: layer.annotations['dev.cosignproject.cosign/signature'],
        },
      });
      v.verify(toSignedEntity(bundle, payload));
      console.log(`cosign signature ${layer.digest}: verified by sigstore-js`);
      verified++;
    }
  }

  // Sigstore bundles among the referrers (tag schema: sha256-<hex>).
  const refs = await fetchOk(`${base}/manifests/sha256-${hex}`, 'application/vnd.oci.image.index.v1+json');
  if (refs.ok) {
    const index = await refs.json();
    for (const entry of index.manifests) {
      if (entry.artifactType !== 'application/vnd.dev.sigstore.bundle.v0.3+json') continue;
      const m = await (await fetchOk(`${base}/manifests/${entry.digest}`, 'application/vnd.oci.image.manifest.v1+json')).json();
      const json = await (await fetchOk(`${base}/blobs/${m.layers[0].digest}`)).json();
      const bundle = bundleFromJSON(json);
      v.verify(toSignedEntity(bundle));
      const statement = JSON.parse(Buffer.from(bundle.content.dsseEnvelope.payload).toString('utf8'));
      if (!statement.subject.some((s) => s.digest.sha256 === hex)) throw new Error('the statement does not name the digest');
      console.log(`sigstore bundle ${m.layers[0].digest}: verified by sigstore-js`);
      verified++;
    }
  }
  if (verified === 0) throw new Error('no signatures found');
}

async function sign(a) {
  const privateKey = crypto.createPrivateKey(fs.readFileSync(a.key, 'utf8'));
  const signer = {
    sign: async (data) => ({
      signature: crypto.sign('sha256', data, privateKey),
      key: { $case: 'publicKey', publicKey: crypto.createPublicKey(privateKey).export({ type: 'spki', format: 'pem' }), hint: 'sigstore-js' },
    }),
  };
  const statement = {
    _type: 'https://in-toto.io/Statement/v1',
    subject: [{ name: a.name, digest: { sha256: a.digest.replace('sha256:', '') } }],
    predicateType: 'https://sigstore.dev/cosign/sign/v1',
    predicate: {},
  };
  const bundle = await new DSSEBundleBuilder({ signer, witnesses: [] }).create({
    data: Buffer.from(JSON.stringify(statement)),
    type: 'application/vnd.in-toto+json',
  });
  fs.writeFileSync(a.out, JSON.stringify(bundleToJSON(bundle)));
  console.log(`wrote ${a.out}`);
}

function genkey(a) {
  const { privateKey, publicKey } = crypto.generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
  fs.writeFileSync(`${a['out-prefix']}.pem`, privateKey.export({ type: 'pkcs8', format: 'pem' }));
  fs.writeFileSync(`${a['out-prefix']}.pub`, publicKey.export({ type: 'spki', format: 'pem' }));
}

const a = args();
const commands = { genkey, sign, 'verify-registry': verifyRegistry };
Promise.resolve()
  .then(() => {
    if (!commands[a._]) throw new Error(`unknown command ${a._}`);
    return commands[a._](a);
  })
  .catch((e) => {
    console.error(`sigstore-js: ${e.message || e}`);
    process.exit(1);
  });
