"""Cross-check of Capstan's cosign-format private keys with independent
crypto: OpenSSL's scrypt (hashlib), libsodium's secretbox (PyNaCl) and
pyca/cryptography for PKCS#8, SPKI and ECDSA. The envelope is the one
go-securesystemslib writes for cosign: JSON {kdf: scrypt N/r/p + salt,
cipher: nacl/secretbox + nonce, ciphertext}, PEM-armoured as
ENCRYPTED SIGSTORE PRIVATE KEY.

  decrypt KEY PASSWORD            print the public key (SPKI PEM) of KEY
  generate PREFIX PASSWORD        write PREFIX.key (encrypted) and PREFIX.pub
  sign KEY PASSWORD FILE          print base64 DER ECDSA-SHA256 of FILE
"""
import base64
import hashlib
import json
import os
import sys

import nacl.secret
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

LABEL = "ENCRYPTED SIGSTORE PRIVATE KEY"


def unarmor(text):
    body = text.split(f"-----BEGIN {LABEL}-----")[1].split(f"-----END {LABEL}-----")[0]
    return json.loads(base64.b64decode("".join(body.split())))


def derive(password, kdf):
    p = kdf["params"]
    return hashlib.scrypt(password.encode(), salt=base64.b64decode(kdf["salt"]), n=p["N"], r=p["r"], p=p["p"],
                          maxmem=256 * 1024 * 1024, dklen=32)


def load(path, password):
    env = unarmor(open(path).read())
    assert env["kdf"]["name"] == "scrypt" and env["cipher"]["name"] == "nacl/secretbox", env
    box = nacl.secret.SecretBox(derive(password, env["kdf"]))
    der = box.decrypt(base64.b64decode(env["ciphertext"]), base64.b64decode(env["cipher"]["nonce"]))
    return serialization.load_der_private_key(der, password=None)


def public_pem(key):
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def main():
    cmd = sys.argv[1]
    if cmd == "decrypt":
        print(public_pem(load(sys.argv[2], sys.argv[3])), end="")
    elif cmd == "generate":
        prefix, password = sys.argv[2], sys.argv[3]
        key = ec.generate_private_key(ec.SECP256R1())
        der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        kdf = {"name": "scrypt", "params": {"N": 65536, "r": 8, "p": 1},
               "salt": base64.b64encode(os.urandom(32)).decode()}
        nonce = os.urandom(24)
        sealed = nacl.secret.SecretBox(derive(password, kdf)).encrypt(der, nonce).ciphertext
        env = {"kdf": kdf, "cipher": {"name": "nacl/secretbox", "nonce": base64.b64encode(nonce).decode()},
               "ciphertext": base64.b64encode(sealed).decode()}
        body = base64.b64encode(json.dumps(env).encode()).decode()
        lines = [body[i:i + 64] for i in range(0, len(body), 64)]
        with open(prefix + ".key", "w") as f:
            f.write(f"-----BEGIN {LABEL}-----\n" + "\n".join(lines) + f"\n-----END {LABEL}-----\n")
        with open(prefix + ".pub", "w") as f:
            f.write(public_pem(key))
    elif cmd == "sign":
        key = load(sys.argv[2], sys.argv[3])
        sig = key.sign(open(sys.argv[4], "rb").read(), ec.ECDSA(hashes.SHA256()))
        print(base64.b64encode(sig).decode())
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
