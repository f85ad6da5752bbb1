//! The signed quiescence marker: a compact JWS (RFC 7515) with EdDSA over Ed25519 (RFC 8037).

use crate::record::container::Container;
use crate::record::evidence::{Evidence, Service};
use crate::record::freeze::Phases;
use crate::state::files;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io;
use std::path::Path;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    pub iss: String,
    pub iat: u64,
    pub jti: String,
    pub nonce: Option<String>,
    pub sandbox_uids: Vec<u32>,
    pub result: String,
    pub survivors: u64,
    pub container: Container,
    pub processes: Vec<Evidence>,
    /// Processes killed but left out of `processes`, which is capped in size.
    #[serde(default)]
    pub processes_omitted: u64,
    pub phases_ms: Phases,
    pub version: String,
    /// Whether a loginuid marked sandbox launches (lineage followed them); absent in markers of
    /// versions before it was carried, which a policy that asks for it refuses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<bool>,
    /// Whether a setuid binary could make a sandbox process root (the init ran without
    /// no_new_privs, so processes entered into the container did too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setuid: Option<bool>,
    /// What defined the sandbox: "uid" (its users' UIDs and their tagged launches) or "lineage"
    /// (every tagged launch, whatever its user, root included). Absent in markers of versions
    /// before it was carried, which were all "uid".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// Whether a sandbox process could be root: launched as root (lineage), or made root by a
    /// setuid binary. Absent in markers of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_root: Option<bool>,
    /// The trees this freeze attests (the init's and the request's), known before signing:
    /// verify requires an envelope that covers them, so a missing one is never a pass. Absent
    /// when nothing is attested, and in markers of earlier versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attest: Vec<String>,
    /// The killed processes that listened on TCP, for `verify --hand-over` (where, their cwd
    /// and environment). Absent when none did, and in markers of earlier versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<Service>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    alg: String,
    typ: Option<String>,
    kid: Option<String>,
}

/// RFC 7638 thumbprint of the public key as a JWK: the `kid`.
pub fn kid(key: &VerifyingKey) -> String {
    let jwk = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#, B64.encode(key.as_bytes()));
    B64.encode(Sha256::digest(jwk.as_bytes()))
}

pub fn generate() -> io::Result<SigningKey> {
    let mut seed = [0u8; 32];
    crate::kernel::random::getrandom(&mut seed)?;
    Ok(SigningKey::from_bytes(&seed))
}

/// PKCS#8 v1 (RFC 8410), the form `openssl genpkey -algorithm ed25519` writes and every
/// OpenSSL reads; v2 with the public key embedded is refused by OpenSSL 3.0.
pub fn private_pem(key: &SigningKey) -> String {
    crate::marker::keypem::encode_private(key.as_bytes())
}

pub fn public_pem(key: &VerifyingKey) -> String {
    crate::marker::keypem::encode_public(key.as_bytes())
}

/// Load a private key, refusing one that anyone but root could read or replace (files.rs).
pub fn load_private(path: &Path) -> Result<SigningKey, String> {
    let text = files::read_key(path, "signing key", files::PRIVATE_KEY)?;
    parse_private(&text).map_err(|e| format!("signing key {}: {e}", path.display()))
}

/// Load a public key named on the command line (it may be reached through links).
pub fn load_public(path: &Path) -> Result<VerifyingKey, String> {
    let text = files::read_key(path, "public key", files::PUBLIC_KEY)?;
    parse_public(&text).map_err(|e| format!("public key {}: {e}", path.display()))
}

pub fn parse_private(text: &[u8]) -> Result<SigningKey, String> {
    let k = crate::marker::keypem::decode_private(text).ok_or("not an Ed25519 PKCS#8 PEM private key")?;
    let key = SigningKey::from_bytes(&k.seed);
    match k.public {
        Some(p) if p != key.verifying_key().to_bytes() => {
            Err("its embedded public key is not the private key's: write the key again".into())
        }
        _ => Ok(key),
    }
}

pub fn parse_public(text: &[u8]) -> Result<VerifyingKey, String> {
    crate::marker::keypem::decode_public(text)
        .and_then(|k| VerifyingKey::from_bytes(&k).ok())
        .ok_or_else(|| "not an Ed25519 SPKI PEM public key".to_string())
}

pub fn sign(key: &SigningKey, claims: &Claims) -> io::Result<String> {
    let header =
        Header { alg: "EdDSA".into(), typ: Some("JWT".into()), kid: Some(kid(&key.verifying_key())) };
    // One buffer for the whole token: the claims may hold a megabyte of evidence.
    let header = serde_json::to_vec(&header).map_err(io::Error::other)?;
    let payload = serde_json::to_vec(claims).map_err(io::Error::other)?;
    let mut token = String::with_capacity((header.len() + payload.len()) * 4 / 3 + 100);
    B64.encode_string(&header, &mut token);
    token.push('.');
    B64.encode_string(&payload, &mut token);
    drop(payload);
    let sig = key.sign(token.as_bytes());
    token.push('.');
    B64.encode_string(sig.to_bytes(), &mut token);
    Ok(token)
}

#[derive(Debug, PartialEq, Eq)]
pub enum Bad {
    /// Not three base64url parts of JSON.
    Malformed(String),
    /// alg other than EdDSA.
    Algorithm(String),
    /// The signature does not verify with this key.
    Signature,
}

/// Check form, algorithm and signature; only then parse the claims.
pub fn verify(token: &str, key: &VerifyingKey) -> Result<Claims, Bad> {
    let token = token.trim();
    let parts: Vec<&str> = token.split('.').collect();
    if parts.len() != 3 {
        return Err(Bad::Malformed(format!("{} parts, a compact JWS has 3", parts.len())));
    }
    let header: Header = B64
        .decode(parts[0])
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| Bad::Malformed("header is not base64url JSON".into()))?;
    if header.alg != "EdDSA" {
        return Err(Bad::Algorithm(header.alg));
    }
    let sig = B64
        .decode(parts[2])
        .ok()
        .and_then(|b| Signature::from_slice(&b).ok())
        .ok_or_else(|| Bad::Malformed("signature is not a base64url Ed25519 signature".into()))?;
    let input = format!("{}.{}", parts[0], parts[1]);
    key.verify_strict(input.as_bytes(), &sig).map_err(|_| Bad::Signature)?;
    let payload = B64.decode(parts[1]).map_err(|_| Bad::Malformed("payload is not base64url".into()))?;
    serde_json::from_slice(&payload).map_err(|e| Bad::Malformed(format!("payload claims: {e}")))
}

/// Claims of a quiescent freeze, for the tests (and fuzz targets) that sign or parse one.
#[cfg(any(test, fuzzing))]
pub fn sample_claims() -> Claims {
    Claims {
        iss: "quiesce".into(),
        iat: 1,
        jti: "id".into(),
        nonce: None,
        sandbox_uids: vec![4242],
        result: "quiescent".into(),
        survivors: 0,
        container: Container { boot_id: "b".into(), pid_ns: 1, hostname: "h".into(), init_start: 2 },
        processes: vec![],
        processes_omitted: 0,
        services: vec![],
        phases_ms: Default::default(),
        version: "0".into(),
        lineage: Some(true),
        setuid: Some(false),
        sandbox: Some("uid".into()),
        agent_root: Some(false),
        attest: vec!["/w".into()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let k = generate().unwrap();
        let t = sign(&k, &sample_claims()).unwrap();
        assert_eq!(verify(&t, &k.verifying_key()).unwrap(), sample_claims());
        let other = generate().unwrap();
        assert_eq!(verify(&t, &other.verifying_key()), Err(Bad::Signature));
        let parts: Vec<&str> = t.split('.').collect();
        let none = format!("{}.{}.", B64.encode(br#"{"alg":"none"}"#), parts[1]);
        assert_eq!(verify(&none, &k.verifying_key()), Err(Bad::Algorithm("none".into())));
        assert!(matches!(verify(&parts[..2].join("."), &k.verifying_key()), Err(Bad::Malformed(_))));
    }

    #[test]
    fn pem_round_trip() {
        let k = generate().unwrap();
        let pem = private_pem(&k);
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert_eq!(parse_private(pem.as_bytes()).unwrap().to_bytes(), k.to_bytes());
        let pubpem = public_pem(&k.verifying_key());
        assert_eq!(parse_public(pubpem.as_bytes()).unwrap(), k.verifying_key());
        // RFC 8410's example key (section 10.3) signs as its example public key (10.1).
        let rfc = "-----BEGIN PRIVATE KEY-----\n\
            MC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n\
            -----END PRIVATE KEY-----\n";
        let rfc_pub = "-----BEGIN PUBLIC KEY-----\n\
            MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n\
            -----END PUBLIC KEY-----\n";
        let rfc = parse_private(rfc.as_bytes()).unwrap();
        assert_eq!(rfc.verifying_key(), parse_public(rfc_pub.as_bytes()).unwrap());
        // A v2 key whose embedded public key belongs to another seed.
        let other = generate().unwrap().verifying_key();
        let v2_head =
            [0x30, 0x51, 0x02, 0x01, 0x01, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
        let v2 = [&v2_head[..], k.as_bytes(), &[0x81, 0x21, 0x00], other.as_bytes()].concat();
        let b64 = base64::engine::general_purpose::STANDARD.encode(v2);
        let v2 = format!("-----BEGIN PRIVATE KEY-----\n{b64}\n-----END PRIVATE KEY-----\n");
        assert!(parse_private(v2.as_bytes()).unwrap_err().contains("not the private key's"));
        // The same layout with the key's own public key is the key.
        let own = [&v2_head[..], k.as_bytes(), &[0x81, 0x21, 0x00], k.verifying_key().as_bytes()].concat();
        let own = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(own)
        );
        assert_eq!(parse_private(own.as_bytes()).unwrap().to_bytes(), k.to_bytes());
    }

    #[test]
    fn a_public_key_file_loads_as_its_key() {
        let k = generate().unwrap();
        let dir = std::env::temp_dir().join(format!("quiesce-jws-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("signing.pub");
        std::fs::write(&path, public_pem(&k.verifying_key())).unwrap();
        let loaded = load_public(&path);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(loaded.unwrap(), k.verifying_key());
    }
}
