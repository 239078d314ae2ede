//! What Capstan reads in certificates, through `x509-parser` (a maintained
//! DER/X.509 reader): the SubjectPublicKeyInfo of a cluster CA (kubeadm's
//! CA pin) and the subject of a node's certificate signing request (which
//! Node a certificate would name).
//!
//! A certificate request is a claim made by whoever holds a bootstrap
//! token, so everything about it is checked before its subject is read:
//! one PEM `CERTIFICATE REQUEST` block of bounded size and nothing after
//! it, DER with no trailing bytes, a signature made by the request's own
//! key, and exactly one common name. Each refusal says what did not hold.

use sha2::{Digest, Sha256};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::{FromDer, X509Certificate};

/// The largest request read: a node's key request is well under 2 KiB.
pub(crate) const MAX_REQUEST_BYTES: usize = 16 * 1024;

/// kubeadm's CA pin: `sha256:` and the hex SHA-256 of the first
/// certificate's DER SubjectPublicKeyInfo.
pub(crate) fn ca_pin(pem: &[u8]) -> Result<String, String> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem)
        .map_err(|e| format!("the cluster CA holds no PEM certificate: {e}"))?;
    if block.label != "CERTIFICATE" {
        return Err(format!(
            "the cluster CA's first PEM block is a {:?}, not a CERTIFICATE",
            block.label
        ));
    }
    let (_, cert) = X509Certificate::from_der(&block.contents)
        .map_err(|e| format!("the cluster CA certificate is not valid X.509: {e}"))?;
    Ok(format!(
        "sha256:{}",
        hex::encode(Sha256::digest(cert.tbs_certificate.subject_pki.raw))
    ))
}

/// The subject a certificate request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestedSubject {
    /// The common name (a Node's is `system:node:<name>`).
    pub(crate) common_name: String,
    /// The organizations (a Node's are exactly `system:nodes`).
    pub(crate) organizations: Vec<String>,
}

/// The subject of a PEM certificate request (PKCS #10), or why the request
/// is not one Capstan reads.
pub(crate) fn request_subject(pem: &[u8]) -> Result<RequestedSubject, String> {
    if pem.len() > MAX_REQUEST_BYTES {
        return Err(format!(
            "the certificate request is {} bytes, more than the {MAX_REQUEST_BYTES} a node key request needs",
            pem.len()
        ));
    }
    let (rest, block) = x509_parser::pem::parse_x509_pem(pem)
        .map_err(|e| format!("the certificate request is not PEM: {e}"))?;
    if block.label != "CERTIFICATE REQUEST" {
        return Err(format!(
            "the PEM block is a {:?}, not a CERTIFICATE REQUEST",
            block.label
        ));
    }
    if !rest.iter().all(u8::is_ascii_whitespace) {
        return Err("the certificate request has data after its PEM block".into());
    }
    let (trailing, request) = X509CertificationRequest::from_der(&block.contents)
        .map_err(|e| format!("the certificate request is not valid PKCS #10 DER: {e}"))?;
    if !trailing.is_empty() {
        return Err(format!(
            "the certificate request has {} bytes after its DER structure",
            trailing.len()
        ));
    }
    request
        .verify_signature()
        .map_err(|e| format!("the certificate request is not signed by its own key: {e}"))?;
    let subject = &request.certification_request_info.subject;
    let text = |what: &str, v: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        v.as_str()
            .map(str::to_string)
            .map_err(|e| format!("the request's {what} is not a string: {e}"))
    };
    let names = subject
        .iter_common_name()
        .map(|v| text("common name", v))
        .collect::<Result<Vec<_>, _>>()?;
    let [common_name] = names.as_slice() else {
        return Err(format!(
            "the certificate request names {} common names; a Node's names exactly one",
            names.len()
        ));
    };
    let organizations = subject
        .iter_organization()
        .map(|v| text("organization", v))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RequestedSubject {
        common_name: common_name.clone(),
        organizations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request(subject: &[(rcgen::DnType, &str)]) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (kind, value) in subject {
            params.distinguished_name.push(kind.clone(), *value);
        }
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    fn node_request() -> String {
        request(&[
            (rcgen::DnType::CommonName, "system:node:pool-1"),
            (rcgen::DnType::OrganizationName, "system:nodes"),
        ])
    }

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
        let wrong = ca_pin(node_request().as_bytes()).unwrap_err();
        assert!(wrong.contains("not a CERTIFICATE"), "{wrong}");
    }

    #[test]
    fn the_subject_is_read_from_a_real_certificate_request() {
        let subject = request_subject(node_request().as_bytes()).unwrap();
        assert_eq!(subject.common_name, "system:node:pool-1");
        assert_eq!(subject.organizations, ["system:nodes"]);
    }

    #[test]
    fn malformed_oversized_and_trailing_requests_are_refused_saying_why() {
        let good = node_request();
        let refused = |bytes: &[u8]| request_subject(bytes).unwrap_err();
        assert!(refused(b"not a request").contains("not PEM"));
        let big = format!("{good}{}", " ".repeat(MAX_REQUEST_BYTES));
        assert!(refused(big.as_bytes()).contains("more than the 16384"));
        let after = format!("{good}garbage");
        assert!(refused(after.as_bytes()).contains("data after its PEM block"));
        let two = format!("{good}{good}");
        assert!(refused(two.as_bytes()).contains("data after its PEM block"));
        // DER with bytes after the request, re-wrapped as PEM.
        let (_, block) = x509_parser::pem::parse_x509_pem(good.as_bytes()).unwrap();
        let mut der = block.contents.clone();
        der.extend_from_slice(&[0, 0, 0]);
        assert!(refused(pem("CERTIFICATE REQUEST", &der).as_bytes()).contains("3 bytes after"));
        // A request whose signature does not match its content.
        let mut tampered = block.contents.clone();
        let at = tampered.len() - 10;
        tampered[at] ^= 0xff;
        assert!(
            refused(pem("CERTIFICATE REQUEST", &tampered).as_bytes())
                .contains("not signed by its own key")
        );
        assert!(
            refused(pem("CERTIFICATE", &block.contents).as_bytes())
                .contains("not a CERTIFICATE REQUEST")
        );
        let none = request(&[(rcgen::DnType::OrganizationName, "system:nodes")]);
        assert!(refused(none.as_bytes()).contains("names 0 common names"));
    }

    fn pem(label: &str, der: &[u8]) -> String {
        use base64::Engine as _;
        let body = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<&str> = body
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            lines.join("\n")
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Random bytes, raw or wrapped as a PEM request, never panic and
        /// never read as a subject.
        #[test]
        fn random_bytes_are_refused_without_panic(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
            prop_assert!(request_subject(&bytes).is_err());
            prop_assert!(request_subject(pem("CERTIFICATE REQUEST", &bytes).as_bytes()).is_err());
            let _ = ca_pin(&bytes);
        }

        /// A real request with bytes changed anywhere is refused or, where
        /// the change left it valid and signed, read (never a panic).
        #[test]
        fn a_request_changed_anywhere_never_panics(at in any::<prop::sample::Index>(), with in any::<u8>()) {
            let good = node_request();
            let (_, block) = x509_parser::pem::parse_x509_pem(good.as_bytes()).unwrap();
            let mut der = block.contents.clone();
            let i = at.index(der.len());
            let changed = der[i] != with;
            der[i] = with;
            let read = request_subject(pem("CERTIFICATE REQUEST", &der).as_bytes());
            if changed {
                // The signature covers every byte but the signature's own.
                prop_assert!(read.is_err() || read.unwrap().common_name == "system:node:pool-1");
            }
        }
    }
}
