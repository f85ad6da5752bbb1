//! Ed25519 keys as PEM (RFC 7468): PKCS#8 private keys and SPKI public keys (RFC 8410).
//!
//! Each accepted form has one fixed DER layout, so a key is read by comparing the decoded bytes
//! with that layout and taking the 32 key bytes from a fixed offset: no tag or length from the
//! file is ever interpreted.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use zeroize::Zeroizing;

/// PKCS#8 v1: SEQUENCE { INTEGER 0, SEQUENCE { OID 1.3.101.112 }, OCTET STRING { OCTET STRING (32) } },
/// the form `openssl genpkey -algorithm ed25519` writes; the seed follows.
const PRIVATE_V1: [u8; 16] =
    [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
/// PKCS#8 v2 (RFC 5958) with version 1 and the public key after the seed, and nothing else.
const PRIVATE_V2: [u8; 16] =
    [0x30, 0x51, 0x02, 0x01, 0x01, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
/// v2's publicKey: [1] IMPLICIT BIT STRING, no unused bits; the 32 key bytes follow.
const PRIVATE_V2_PUBLIC: [u8; 3] = [0x81, 0x21, 0x00];
/// SubjectPublicKeyInfo: SEQUENCE { SEQUENCE { OID 1.3.101.112 }, BIT STRING (32) }; the key follows.
const PUBLIC: [u8; 12] = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];

/// Base64 characters of the longest accepted form (83 bytes of DER); longer text is refused
/// before anything is decoded.
const MAX_BASE64: usize = 112;

/// A private key as read: the seed, and the public key when the file carries one (v2).
pub struct Private {
    pub seed: Zeroizing<[u8; 32]>,
    pub public: Option<[u8; 32]>,
}

pub fn encode_private(seed: &[u8; 32]) -> String {
    let mut der = Zeroizing::new([0u8; 48]);
    der[..16].copy_from_slice(&PRIVATE_V1);
    der[16..].copy_from_slice(seed);
    // 48 bytes are 64 base64 characters: one line, as RFC 7468 wraps.
    format!("-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n", STANDARD.encode(&der[..]))
}

pub fn encode_public(key: &[u8; 32]) -> String {
    let mut der = [0u8; 44];
    der[..12].copy_from_slice(&PUBLIC);
    der[12..].copy_from_slice(key);
    format!("-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n", STANDARD.encode(der))
}

pub fn decode_private(text: &[u8]) -> Option<Private> {
    let mut der = Zeroizing::new([0u8; 96]);
    let n = decode(text, "PRIVATE KEY", &mut der[..])?;
    let mut seed = Zeroizing::new([0u8; 32]);
    seed.copy_from_slice(&der[16..48]);
    match n {
        48 if der[..16] == PRIVATE_V1 => Some(Private { seed, public: None }),
        83 if der[..16] == PRIVATE_V2 && der[48..51] == PRIVATE_V2_PUBLIC => {
            let mut public = [0u8; 32];
            public.copy_from_slice(&der[51..83]);
            Some(Private { seed, public: Some(public) })
        }
        _ => None,
    }
}

pub fn decode_public(text: &[u8]) -> Option<[u8; 32]> {
    let mut der = [0u8; 96];
    let n = decode(text, "PUBLIC KEY", &mut der)?;
    if n != 44 || der[..12] != PUBLIC {
        return None;
    }
    let mut key = [0u8; 32];
    key.copy_from_slice(&der[12..44]);
    Some(key)
}

/// The DER between `-----BEGIN label-----` and `-----END label-----` (surrounding whitespace
/// and line breaks allowed, canonical padded base64 required) into `out`; its length.
fn decode(text: &[u8], label: &str, out: &mut [u8]) -> Option<usize> {
    let text = text.trim_ascii();
    let text = text.strip_prefix(b"-----BEGIN ")?.strip_suffix(b"-----")?;
    let text = text.strip_prefix(label.as_bytes())?.strip_prefix(b"-----")?;
    let inner = text.strip_suffix(label.as_bytes())?.strip_suffix(b"-----END ")?;
    if inner.len() > 4 * MAX_BASE64 {
        return None;
    }
    let mut b64 = Zeroizing::new(Vec::with_capacity(inner.len()));
    b64.extend(inner.iter().copied().filter(|b| !b.is_ascii_whitespace()));
    if b64.len() > MAX_BASE64 {
        return None;
    }
    STANDARD.decode_slice(&b64[..], out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 8410, section 10.3 (the v1 key) and 10.1 (its public key).
    const RFC_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\n\
        MC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n\
        -----END PRIVATE KEY-----\n";
    const RFC_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\n\
        MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n\
        -----END PUBLIC KEY-----\n";
    const RFC_SEED: &str = "d4ee72dbf913584ad5b6d8f1f769f8ad3afe7c28cbf1d4fbe097a88f44755842";
    const RFC_KEY: &str = "19bf44096984cdfe8541bac167dc3b96c85086aa30b6b6cb0c5c38ad703166e1";

    fn hex(s: &str) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
        }
        out
    }

    fn pem(label: &str, der: &[u8]) -> String {
        format!("-----BEGIN {label}-----\n{}\n-----END {label}-----\n", STANDARD.encode(der))
    }

    #[test]
    fn reads_the_rfc_keys_and_writes_them_back() {
        let k = decode_private(RFC_PRIVATE.as_bytes()).unwrap();
        assert_eq!(*k.seed, hex(RFC_SEED));
        assert_eq!(k.public, None);
        assert_eq!(encode_private(&k.seed), RFC_PRIVATE);
        let p = decode_public(RFC_PUBLIC.as_bytes()).unwrap();
        assert_eq!(p, hex(RFC_KEY));
        assert_eq!(encode_public(&p), RFC_PUBLIC);
        // CRLF, indentation and surrounding blank lines are line breaks and spaces, nothing more.
        let crlf = format!("\r\n  {}\r\n", RFC_PRIVATE.replace('\n', "\r\n"));
        assert_eq!(*decode_private(crlf.as_bytes()).unwrap().seed, hex(RFC_SEED));
    }

    #[test]
    fn reads_v2_with_its_public_key() {
        let mut der = PRIVATE_V2.to_vec();
        der.extend_from_slice(&hex(RFC_SEED));
        der.extend_from_slice(&PRIVATE_V2_PUBLIC);
        der.extend_from_slice(&hex(RFC_KEY));
        let k = decode_private(pem("PRIVATE KEY", &der).as_bytes()).unwrap();
        assert_eq!((*k.seed, k.public), (hex(RFC_SEED), Some(hex(RFC_KEY))));
    }

    #[test]
    fn refuses_every_other_layout() {
        let seed = hex(RFC_SEED);
        let good = [&PRIVATE_V1[..], &seed].concat();
        // Each single changed byte of the fixed layout: version, OID, lengths, tags.
        for i in 0..16 {
            let mut bad = good.clone();
            bad[i] ^= 0x01;
            assert!(decode_private(pem("PRIVATE KEY", &bad).as_bytes()).is_none(), "byte {i}");
        }
        // Short, long, trailing data, v2 without or with another public-key tag.
        for bad in [&good[..47], &[&good[..], &[0]].concat()[..], &[&good[..], &good[..]].concat()[..]] {
            assert!(decode_private(pem("PRIVATE KEY", bad).as_bytes()).is_none());
        }
        let mut v2 = [&PRIVATE_V2[..], &seed, &PRIVATE_V2_PUBLIC, &hex(RFC_KEY)].concat();
        v2[48] = 0xa1;
        assert!(decode_private(pem("PRIVATE KEY", &v2).as_bytes()).is_none());
        // The right DER under the wrong label, or a public key read as private and back.
        assert!(decode_private(pem("PUBLIC KEY", &good).as_bytes()).is_none());
        assert!(decode_public(RFC_PRIVATE.as_bytes()).is_none());
        assert!(decode_private(RFC_PUBLIC.as_bytes()).is_none());
        let key = [&PUBLIC[..], &hex(RFC_KEY)].concat();
        for i in 0..12 {
            let mut bad = key.clone();
            bad[i] ^= 0x01;
            assert!(decode_public(pem("PUBLIC KEY", &bad).as_bytes()).is_none(), "byte {i}");
        }
        // Missing or mismatched boundaries, text around them, unpadded or non-canonical base64.
        let body = "MC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC";
        for bad in [
            body.to_string(),
            format!("-----BEGIN PRIVATE KEY-----\n{body}\n"),
            format!("-----BEGIN PRIVATE KEY-----\n{body}\n-----END PUBLIC KEY-----\n"),
            format!("junk\n{RFC_PRIVATE}"),
            format!("{RFC_PRIVATE}junk\n"),
            RFC_PUBLIC.replace("4rXAxZuE=", "4rXAxZuE"),
            RFC_PUBLIC.replace("4rXAxZuE=", "4rXAxZuF="),
            String::new(),
        ] {
            assert!(
                decode_private(bad.as_bytes()).is_none() && decode_public(bad.as_bytes()).is_none(),
                "{bad}"
            );
        }
    }
}
