//! Just enough DER to read what Capstan checks in certificates: the
//! SubjectPublicKeyInfo of a cluster CA (kubeadm's CA pin) and the subject
//! of a certificate signing request (who a node certificate would name).
//! No general ASN.1: each reader walks the fields it needs and answers
//! `None` (or an error naming what is wrong) for anything else.

use sha2::{Digest, Sha256};

/// kubeadm's CA pin: `sha256:` and the hex SHA-256 of the first
/// certificate's DER SubjectPublicKeyInfo.
pub(crate) fn ca_pin(pem: &[u8]) -> Result<String, String> {
    let der = first_certificate_der(pem)?;
    let spki = subject_public_key_info(&der)
        .ok_or("the cluster CA certificate is not valid DER (no SubjectPublicKeyInfo)")?;
    Ok(format!("sha256:{}", hex::encode(Sha256::digest(spki))))
}

fn first_certificate_der(pem: &[u8]) -> Result<Vec<u8>, String> {
    let text = String::from_utf8_lossy(pem);
    let body = text
        .split("-----BEGIN CERTIFICATE-----")
        .nth(1)
        .and_then(|rest| rest.split("-----END CERTIFICATE-----").next())
        .ok_or("the cluster CA holds no PEM certificate")?;
    let b64: String = body.chars().filter(|c| !c.is_whitespace()).collect();
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("the cluster CA certificate is not valid base64: {e}"))
}

/// One DER element at the start of `der`: (tag, whole element, content).
pub(crate) fn element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *der.first()?;
    let first = *der.get(1)?;
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for b in der.get(2..2 + n)? {
            len = (len << 8) | usize::from(*b);
        }
        (len, 2 + n)
    };
    let whole = der.get(..header + len)?;
    Some((tag, whole, &whole[header..]))
}

/// The SubjectPublicKeyInfo element of a DER certificate: the seventh
/// field of tbsCertificate, counting the optional `[0]` version.
fn subject_public_key_info(cert: &[u8]) -> Option<&[u8]> {
    let (_, _, certificate) = element(cert)?;
    let (_, _, tbs) = element(certificate)?;
    let mut rest = tbs;
    let mut fields = Vec::new();
    while !rest.is_empty() && fields.len() < 8 {
        let (tag, whole, _) = element(rest)?;
        fields.push((tag, whole));
        rest = &rest[whole.len()..];
    }
    // version [0] is optional; then serial, signature, issuer, validity,
    // subject, subjectPublicKeyInfo.
    let skip = usize::from(fields.first()?.0 == 0xa0);
    let (tag, spki) = *fields.get(skip + 5)?;
    (tag == 0x30).then_some(spki)
}

/// The subject's common name and organizations of a PEM certificate
/// request (PKCS #10).
pub(crate) fn request_subject(pem: &[u8]) -> Option<(Option<String>, Vec<String>)> {
    use base64::Engine as _;
    let text = std::str::from_utf8(pem).ok()?;
    let body = text
        .split("-----BEGIN CERTIFICATE REQUEST-----")
        .nth(1)?
        .split("-----END CERTIFICATE REQUEST-----")
        .next()?;
    let b64: String = body.chars().filter(|c| !c.is_whitespace()).collect();
    let der = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let (_, _, request) = element(&der)?;
    let (_, _, info) = element(request)?;
    // version INTEGER, then subject Name.
    let (_, version, _) = element(info)?;
    let (_, _, mut name) = element(&info[version.len()..])?;
    const CN: &[u8] = &[0x55, 0x04, 0x03];
    const O: &[u8] = &[0x55, 0x04, 0x0a];
    let (mut common_name, mut organizations) = (None, Vec::new());
    // Name ::= SEQUENCE OF SET OF SEQUENCE { type OID, value string }
    while !name.is_empty() {
        let (_, set, set_content) = element(name)?;
        name = &name[set.len()..];
        let (_, _, attribute) = element(set_content)?;
        let (_, oid, oid_value) = element(attribute)?;
        let (_, _, value) = element(&attribute[oid.len()..])?;
        let value = String::from_utf8_lossy(value).into_owned();
        if oid_value == CN {
            common_name = Some(value);
        } else if oid_value == O {
            organizations.push(value);
        }
    }
    Some((common_name, organizations))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_pin_is_the_hash_of_the_public_key_info() {
        use rcgen::PublicKeyData as _;
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["ca".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let expected = format!(
            "sha256:{}",
            hex::encode(Sha256::digest(key.subject_public_key_info()))
        );
        assert_eq!(ca_pin(cert.pem().as_bytes()).unwrap(), expected);
        assert!(ca_pin(b"not a certificate").is_err());
    }

    #[test]
    fn the_subject_is_read_from_a_real_certificate_request() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:pool-1");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        let pem = params.serialize_request(&key).unwrap().pem().unwrap();
        let (cn, orgs) = request_subject(pem.as_bytes()).unwrap();
        assert_eq!(cn.as_deref(), Some("system:node:pool-1"));
        assert_eq!(orgs, ["system:nodes"]);
        assert!(request_subject(b"not a request").is_none());
    }
}
