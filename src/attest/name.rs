//! Names in a statement: a path's bytes as text, losslessly. Printable UTF-8 stays as it is;
//! `%`, control characters (C0, DEL, C1, U+2028, U+2029) and every byte that is not part of
//! valid UTF-8 become `%XX` (uppercase hex), one per byte. docs/attestation.md states the rule.

/// Does this character stand for itself in a name?
fn plain(c: char) -> bool {
    !(c == '%' || c.is_control() || c == '\u{2028}' || c == '\u{2029}')
}

fn escape(out: &mut String, bytes: &[u8]) {
    for b in bytes {
        out.push('%');
        out.push(char::from(b"0123456789ABCDEF"[(b >> 4) as usize]));
        out.push(char::from(b"0123456789ABCDEF"[(b & 15) as usize]));
    }
}

pub fn encode(mut bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    while !bytes.is_empty() {
        let (valid, rest) = match std::str::from_utf8(bytes) {
            Ok(s) => (s, &[][..]),
            Err(e) => {
                let (ok, bad) = bytes.split_at(e.valid_up_to());
                // SAFETY-free: from_utf8 said these bytes are valid.
                (std::str::from_utf8(ok).unwrap_or_default(), bad)
            }
        };
        // Runs of plain characters are copied whole: a name is mostly one such run.
        let mut run = 0;
        for (i, c) in valid.char_indices() {
            if !plain(c) {
                out.push_str(&valid[run..i]);
                let mut b = [0u8; 4];
                escape(&mut out, c.encode_utf8(&mut b).as_bytes());
                run = i + c.len_utf8();
            }
        }
        out.push_str(&valid[run..]);
        bytes = rest;
        if !bytes.is_empty() {
            // The invalid sequence's length, or one byte when the input ends inside one.
            let n = std::str::from_utf8(bytes).err().and_then(|e| e.error_len()).unwrap_or(1);
            let n = n.min(bytes.len());
            escape(&mut out, &bytes[..n]);
            bytes = &bytes[n..];
        }
    }
    out
}

/// Characters of a name a message shows at most: a path 256 levels deep of 255-byte names is
/// 65 KB, and the init keeps 4 KB of the worker's reason, so a whole path would push out the
/// reason's end, the part that says what to do.
pub const SHOWN: usize = 240;

/// A name's bytes encoded for a message, its middle left out past `SHOWN` characters.
pub fn shown(bytes: &[u8]) -> String {
    cut(&encode(bytes))
}

/// An encoded name for a message: whole up to `SHOWN` characters, else its head and its tail
/// (which tree, which entry) around the count of what was left out.
pub fn cut(s: &str) -> String {
    let n = s.chars().count();
    if n <= SHOWN {
        return s.to_string();
    }
    let keep = SHOWN / 2;
    let c: Vec<char> = s.chars().collect();
    // Never inside a `%XX`: each end stays decodable.
    let mut head = keep;
    if let Some(back) = c[head.saturating_sub(2)..head].iter().position(|&x| x == '%') {
        head = head - 2 + back;
    }
    let mut tail = n - keep;
    if let Some(back) = c[tail.saturating_sub(2)..tail].iter().position(|&x| x == '%') {
        tail = tail - 2 + back + 3;
    }
    let (h, t): (String, String) = (c[..head].iter().collect(), c[tail..].iter().collect());
    format!("{h}…[{} characters]…{t}", tail - head)
}

pub fn decode(s: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            let byte =
                hex.filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit())).map(|h| u8::from_str_radix(h, 16));
            match byte {
                Some(Ok(v)) => out.push(v),
                _ => return Err(format!("name {s:?} has a '%' not followed by two hex digits")),
            }
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_name_is_shown_by_its_ends() {
        assert_eq!(shown(b"/w/a\nb"), "/w/a%0Ab");
        let long = format!("/w/{}leaf", "d/".repeat(1000));
        let s = shown(long.as_bytes());
        assert!(s.chars().count() < SHOWN + 40, "{s}");
        assert!(s.starts_with("/w/d/d/") && s.ends_with("d/leaf"), "{s}");
        assert!(s.contains(&format!("…[{} characters]…", long.len() - SHOWN)), "{s}");
        let exact = "x".repeat(SHOWN);
        assert_eq!(cut(&exact), exact);
        // Never inside an escape, at either end.
        for at in 115..125 {
            let e = format!("/w/{}%0A{}", "a".repeat(at), "b".repeat(500));
            let shown = cut(&e);
            let (h, t) = shown.split_once('…').unwrap_or_default();
            let t = t.rsplit_once('…').map(|x| x.1).unwrap_or_default();
            assert!(decode(h).is_ok() && decode(t).is_ok(), "{at}: {shown}");
            assert!(!t.starts_with('0') && !t.starts_with('A'), "{at}: {shown}");
        }
        // Never cut inside a character.
        let wide = "é".repeat(2 * SHOWN);
        assert!(cut(&wide).starts_with(&"é".repeat(SHOWN / 2)));
    }

    #[test]
    fn round_trips_and_escapes_what_is_not_printable() {
        let cases: &[&[u8]] = &[
            b"/w/plain.txt",
            b"/w/new\nline",
            b"/w/\xff\xfe-not-utf8",
            b"/w/100%",
            "/w/caf\u{e9}/\u{1F600}".as_bytes(),
            b"/w/\xe2\x82",
            b"/w/\x7f\x00",
            "/w/\u{2028}\u{85}".as_bytes(),
        ];
        for c in cases {
            let e = encode(c);
            assert!(!e.chars().any(|ch| ch.is_control()), "{e:?}");
            assert_eq!(decode(&e).unwrap(), *c, "{e}");
        }
        assert_eq!(encode(b"/w/new\nline"), "/w/new%0Aline");
        assert_eq!(encode(b"/w/100%"), "/w/100%25");
        assert_eq!(encode(b"/w/\xff"), "/w/%FF");
        assert_eq!(encode("/w/caf\u{e9}".as_bytes()), "/w/caf\u{e9}");
        assert!(decode("/w/%G0").is_err());
        assert!(decode("/w/%4").is_err());
    }
}
