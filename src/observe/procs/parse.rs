//! The parsers of /proc/PID/stat, status and cmdline, and of the names /proc and a task
//! directory list. May use: kernel, observe.

use crate::kernel::process::Pid;
use crate::observe::procs::model::{Comm, Named, Proc, Threads};

pub struct Stat {
    pub pid: Pid,
    pub comm: String,
    pub state: char,
    pub ppid: Pid,
    pub pgid: Pid,
    /// Parsed with the rest (the parser's tests check it); nothing keeps or decides on it.
    #[allow(dead_code)]
    pub sid: Pid,
    /// Field 20: threads not yet released (a dead process's zombie leader counts as one).
    pub num_threads: i64,
    pub start_time: u64,
}

impl Stat {
    /// The process this stat line describes, with what else was read of it.
    pub(super) fn into_proc(
        self,
        threads: Threads,
        loginuid: Option<u32>,
        named: Option<Box<Named>>,
    ) -> Proc {
        Proc {
            pid: self.pid,
            ppid: self.ppid,
            pgid: self.pgid,
            state: self.state,
            start_time: self.start_time,
            comm: Comm::from(self.comm.as_str()),
            named,
            loginuid,
            threads,
        }
    }
}

/// Parse /proc/PID/stat. comm may hold spaces, parentheses and newlines, so the fields after
/// it are found from the *last* ')'.
pub fn parse_stat(text: &[u8]) -> Result<Stat, String> {
    let open = text.iter().position(|&b| b == b'(').ok_or("stat has no '('")?;
    let close = text.iter().rposition(|&b| b == b')').ok_or("stat has no ')'")?;
    if close < open {
        return Err("stat has ')' before '('".into());
    }
    let pid = std::str::from_utf8(&text[..open])
        .map_err(|_| "stat pid is not text")?
        .trim()
        .parse()
        .map_err(|_| "stat pid is not a number")?;
    let comm = String::from_utf8_lossy(&text[open + 1..close]).into_owned();
    let rest = std::str::from_utf8(&text[close + 1..]).map_err(|_| "stat fields are not text")?;
    // f[0] is field 3 (state); field N is f[N-3]. Fields 3 to 22 are read; no list is built.
    let mut f = [""; 20];
    let mut n = 0;
    for (slot, field) in f.iter_mut().zip(rest.split_ascii_whitespace()) {
        *slot = field;
        n += 1;
    }
    if n < 20 {
        return Err(format!("stat has {n} fields after comm, expected at least 20"));
    }
    let num = |i: usize| -> Result<i64, String> {
        f[i].parse::<i64>().map_err(|_| format!("stat field {} is not a number", i + 3))
    };
    let state = f[0].chars().next().ok_or("stat state is empty")?;
    Ok(Stat {
        pid,
        comm,
        state,
        ppid: num(1)? as Pid,
        pgid: num(2)? as Pid,
        sid: num(3)? as Pid,
        num_threads: num(17)?,
        start_time: f[19].parse().map_err(|_| "stat field 22 is not a number")?,
    })
}

/// The state field of a stat line (the character after the last ')'), without the rest.
pub fn stat_state(text: &[u8]) -> Result<char, String> {
    let close = text.iter().rposition(|&b| b == b')').ok_or("stat has no ')'")?;
    match text.get(close + 1..close + 3) {
        Some([b' ', c]) if c.is_ascii_alphabetic() => Ok(*c as char),
        _ => Err("stat has no state after comm".into()),
    }
}

/// Parse the State, Uid, Gid (and Threads, where present) lines of a status file.
pub fn parse_status(text: &str) -> Result<(char, [u32; 4], [u32; 4]), String> {
    parse_status_threads(text).map(|s| (s.state, s.uids, s.gids))
}

pub struct Status {
    pub state: char,
    pub uids: [u32; 4],
    pub gids: [u32; 4],
    /// None in a status without the line (every kernel since 2.6 writes it).
    pub threads: Option<usize>,
    /// The thread group this task belongs to (None in a status without the line).
    pub tgid: Option<Pid>,
}

pub fn parse_status_threads(text: &str) -> Result<Status, String> {
    let mut tgid = None;
    let mut state = None;
    let mut uids = None;
    let mut gids = None;
    let mut threads = None;
    let four = |v: &str| -> Option<[u32; 4]> {
        let mut out = [0u32; 4];
        let mut n = 0;
        for x in v.split_ascii_whitespace() {
            let id = x.parse().ok()?;
            *out.get_mut(n)? = id;
            n += 1;
        }
        (n == 4).then_some(out)
    };
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("State:") {
            state = v.trim().chars().next();
        } else if let Some(v) = line.strip_prefix("Uid:") {
            uids = four(v);
        } else if let Some(v) = line.strip_prefix("Gid:") {
            gids = four(v);
        } else if let Some(v) = line.strip_prefix("Threads:") {
            threads = Some(v.trim().parse().map_err(|_| "status Threads is not a number")?);
        } else if let Some(v) = line.strip_prefix("Tgid:") {
            tgid = Some(v.trim().parse().map_err(|_| "status Tgid is not a number")?);
        }
    }
    Ok(Status {
        state: state.ok_or("status has no State line")?,
        uids: uids.ok_or("status has no valid Uid line")?,
        gids: gids.ok_or("status has no valid Gid line")?,
        threads,
        tgid,
    })
}

/// A status file's TracerPid (0: none); None without a readable line.
pub fn tracer_pid(status: &[u8]) -> Option<Pid> {
    let line = status.split(|&b| b == b'\n').find_map(|l| l.strip_prefix(b"TracerPid:"))?;
    std::str::from_utf8(line).ok()?.trim().parse().ok()
}

/// A cmdline file's words (NUL-separated, empty ones left out), each shown as text.
pub fn cmdline_words(b: &[u8]) -> Vec<String> {
    b.split(|&c| c == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect()
}

/// The second word of a cmdline file (empty when there is none).
pub fn second_word(b: &[u8]) -> &[u8] {
    b.split(|&c| c == 0).nth(1).unwrap_or_default()
}

/// The pid an entry of /proc or of /proc/PID/task names; None for an entry that names none.
pub fn listed_pid(name: &[u8]) -> Option<Pid> {
    std::str::from_utf8(name).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_hostile_comm() {
        let line = b"42 (a) b (c\nd) ) S 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 98765 1000 10";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.pid, 42);
        assert_eq!(s.comm, "a) b (c\nd) ");
        assert_eq!((s.state, s.ppid, s.pgid, s.sid), ('S', 1, 42, 42));
        assert_eq!(s.start_time, 98765);
    }

    #[test]
    fn stat_malformed_is_an_error() {
        assert!(parse_stat(b"42 (x S 1").is_err());
        assert!(parse_stat(b"42 (x) S 1 2").is_err());
        assert!(parse_stat(b"x (y) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0").is_err());
        assert!(parse_stat(b"42 )x( S").is_err());
    }

    #[test]
    fn status_lines() {
        let t = "Name:\tx\nState:\tT (stopped)\nUid:\t4242\t0\t0\t4242\nGid:\t1\t2\t3\t4\n";
        assert_eq!(parse_status(t).unwrap(), ('T', [4242, 0, 0, 4242], [1, 2, 3, 4]));
        assert!(parse_status("State:\tS\nUid:\t1 2 3\nGid:\t1 2 3 4\n").is_err());
        assert!(parse_status("Uid:\t1 2 3 4\nGid:\t1 2 3 4\n").is_err());
    }

    #[test]
    fn stat_state_after_a_hostile_comm() {
        assert_eq!(stat_state(b"42 (a) b (c\nd) ) T 1 42 42 0").unwrap(), 'T');
        assert_eq!(stat_state(b"42 (x) t 1").unwrap(), 't');
        assert!(stat_state(b"42 (x S 1").is_err());
        assert!(stat_state(b"42 (x)").is_err());
        assert!(stat_state(b"42 (x)  S").is_err());
    }

    #[test]
    fn cmdline_listing_and_tracer() {
        assert_eq!(cmdline_words(b"sh\0-c\0\0x\xff\0"), ["sh", "-c", "x\u{fffd}"]);
        assert!(cmdline_words(b"").is_empty() && cmdline_words(b"\0\0").is_empty());
        assert_eq!(second_word(b"quiesce\0freeze\0--wait\0"), b"freeze");
        assert_eq!(second_word(b"quiesce"), b"");
        assert_eq!((listed_pid(b"42"), listed_pid(b"self"), listed_pid(b"\xff1")), (Some(42), None, None));
        assert_eq!(tracer_pid(b"Name:\tx\nTracerPid:\t 7 \nUid:\t0\n"), Some(7));
        assert_eq!((tracer_pid(b"TracerPid:\tx\n"), tracer_pid(b"Name:\tx\n")), (None, None));
    }
}
