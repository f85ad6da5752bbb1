//! The DSSE envelope (github.com/secure-systems-lab/dsse, protocol v1): the payload signed as
//! its pre-authentication encoding, PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body)
//! SP body, with LEN the byte length in ASCII decimal; Ed25519 with the marker's key, whose kid
//! is the signature's keyid. Base64 is the standard alphabet with padding, as the spec's
//! reference implementation writes it.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";

#[derive(Debug, Serialize, Deserialize)]
pub struct Envelope {
    pub payload: String,
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    pub signatures: Vec<Sig>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Sig {
    pub keyid: String,
    pub sig: String,
}

pub fn pae(payload_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!("DSSEv1 {} {} {} ", payload_type.len(), payload_type, body.len()).into_bytes();
    out.extend_from_slice(body);
    out
}

/// The envelope as one line of JSON, with its newline (the file is JSON Lines).
pub fn sign(key: &SigningKey, body: &[u8]) -> Result<Vec<u8>, String> {
    let sig = key.sign(&pae(PAYLOAD_TYPE, body));
    // Written out, not serialized: every field is base64 or the constant type, none has a
    // character JSON escapes, and a serializer would scan a million files' payload once more.
    let mut line = Vec::with_capacity(body.len() / 3 * 4 + 256);
    line.extend_from_slice(b"{\"payload\":\"");
    let at = line.len();
    line.resize(at + base64::encoded_len(body.len(), true).unwrap_or(0), 0);
    let n = B64.encode_slice(body, &mut line[at..]).map_err(|e| format!("cannot encode the payload: {e}"))?;
    line.truncate(at + n);
    let keyid = crate::marker::jws::kid(&key.verifying_key());
    let sig = B64.encode(sig.to_bytes());
    line.extend_from_slice(
        format!(r#"","payloadType":"{PAYLOAD_TYPE}","signatures":[{{"keyid":"{keyid}","sig":"{sig}"}}]}}"#)
            .as_bytes(),
    );
    line.push(b'\n');
    Ok(line)
}

/// The payload of an envelope signed by `key` (its keyid must be the key's kid).
pub fn open(text: &[u8], key: &VerifyingKey) -> Result<Vec<u8>, String> {
    let env: Envelope = serde_json::from_slice(text).map_err(|e| format!("is not a DSSE envelope: {e}"))?;
    if env.payload_type != PAYLOAD_TYPE {
        return Err(format!("has payloadType {:?}, not {PAYLOAD_TYPE}", env.payload_type));
    }
    let body = B64.decode(&env.payload).map_err(|_| "has a payload that is not base64".to_string())?;
    let kid = crate::marker::jws::kid(key);
    let sig = env
        .signatures
        .iter()
        .find(|s| s.keyid == kid)
        .ok_or_else(|| format!("has no signature with keyid {kid} (the marker's key)"))?;
    let sig = B64
        .decode(&sig.sig)
        .ok()
        .and_then(|b| Signature::from_slice(&b).ok())
        .ok_or("has a signature that is not a base64 Ed25519 signature")?;
    key.verify_strict(&pae(PAYLOAD_TYPE, &body), &sig)
        .map_err(|_| "signature does not verify with the marker's key".to_string())?;
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_is_the_specs() {
        // The DSSE protocol's own example.
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
    }

    #[test]
    fn the_written_envelope_is_what_a_serializer_writes() {
        let k = crate::marker::jws::generate().unwrap();
        for body in [&b""[..], b"x", b"{\"a\":1}", &[0xff; 1000]] {
            let line = sign(&k, body).unwrap();
            let e: Envelope = serde_json::from_slice(&line).unwrap();
            let mut again = serde_json::to_vec(&e).unwrap();
            again.push(b'\n');
            assert_eq!(String::from_utf8_lossy(&line), String::from_utf8_lossy(&again));
            assert_eq!(B64.decode(&e.payload).unwrap(), body);
        }
    }

    #[test]
    fn sign_open_and_refuse() {
        let k = crate::marker::jws::generate().unwrap();
        let env = sign(&k, b"{\"a\":1}").unwrap();
        assert_eq!(open(&env, &k.verifying_key()).unwrap(), b"{\"a\":1}");
        let other = crate::marker::jws::generate().unwrap();
        assert!(open(&env, &other.verifying_key()).unwrap_err().contains("keyid"));
        let mut e: Envelope = serde_json::from_slice(&env).unwrap();
        e.payload = B64.encode(b"{\"a\":2}");
        let forged = serde_json::to_vec(&e).unwrap();
        assert!(open(&forged, &k.verifying_key()).unwrap_err().contains("does not verify"));
    }
}
