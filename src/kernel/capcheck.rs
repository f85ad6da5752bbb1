//! The capabilities a freeze needs, checked before the command runs: an init that started
//! without them would fail every freeze later, when the agent has had its turn and nothing can
//! be done about it. Measured on the kernel, each one dropped in turn:
//! - CAP_SETUID: the kernel-side kill(-1) is sent from a context switched to each sandbox UID;
//!   without it every freeze fails, and `quiesce exec` / `--run-as` cannot start the agent.
//! - CAP_KILL: root signals, through pidfds, the sandbox processes that now run under another UID
//!   (a setuid binary, `sudo -u`); without it such a freeze fails instead of certifying.
//! - CAP_SETGID: the exe evidence of other users' processes is read with their filesystem IDs
//!   (both UID and GID must match); without it the marker's exe fields are empty, and
//!   `quiesce exec` / `--run-as` cannot set the agent's groups.
//!
//! Not needed: CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_CHOWN, CAP_FOWNER (the state dir and
//! keys are root's own; /proc's stat, status and cmdline are world-readable), CAP_SYS_PTRACE
//! (only with a hidepid /proc, which proctrust checks), CAP_AUDIT_* (an unset loginuid is
//! written without privilege).

use caps::{CapSet, Capability};

/// What a freeze needs, with the reason each is needed, in the order the fix names them.
pub const NEEDED: &[(Capability, &str)] = &[
    (Capability::CAP_KILL, "signal sandbox processes that changed UID"),
    (Capability::CAP_SETGID, "read exe evidence and set the agent's groups"),
    (Capability::CAP_SETUID, "signal as each sandbox UID"),
];

/// The name engines and Kubernetes use: CAP_KILL -> KILL.
pub fn short_name(c: Capability) -> String {
    let full = c.to_string();
    full.strip_prefix("CAP_").unwrap_or(&full).to_string()
}

/// Is `cap` in this thread's effective set? Unknown counts as absent: the caller then refuses
/// rather than trusts.
pub fn effective(cap: Capability) -> bool {
    caps::has_cap(None, CapSet::Effective, cap).unwrap_or(false)
}

/// The needed capabilities `has` says are missing.
fn missing_of(has: impl Fn(Capability) -> bool) -> Vec<Capability> {
    NEEDED.iter().map(|&(c, _)| c).filter(|&c| !has(c)).collect()
}

/// One line naming what is missing, why, and how to grant it.
fn refusal(missing: &[Capability]) -> String {
    let names: Vec<String> = missing.iter().map(|&c| c.to_string()).collect();
    let why: Vec<&str> = NEEDED.iter().filter(|(c, _)| missing.contains(c)).map(|&(_, why)| why).collect();
    let short: Vec<String> = missing.iter().map(|&c| short_name(c)).collect();
    let docker: Vec<String> = short.iter().map(|s| format!("--cap-add {s}")).collect();
    format!(
        "a freeze needs {} (to {}), which this init lacks: add {} (docker run {} ...; Kubernetes: \
         securityContext.capabilities.add: [{}])",
        names.join(", "),
        why.join("; "),
        if missing.len() == 1 { "it" } else { "them" },
        docker.join(" "),
        short.join(", ")
    )
}

/// Refuse, in one line, an init that lacks a capability a freeze needs.
pub fn check() -> Result<(), String> {
    let missing = missing_of(effective);
    if missing.is_empty() {
        Ok(())
    } else {
        Err(refusal(&missing))
    }
}

/// Could a process of this container gain CAP_AUDIT_CONTROL, with which a process may change
/// its loginuid once set? Only if it is in this process's bounding set (which caps what any
/// exec here grants). Unknown counts as yes.
pub fn audit_control_possible() -> bool {
    caps::has_cap(None, CapSet::Bounding, Capability::CAP_AUDIT_CONTROL).unwrap_or(true)
}

/// Take CAP_AUDIT_CONTROL out of every set of this thread, bounding set first (which needs
/// CAP_SETPCAP), so that nothing it execs, nor anything that starts, can hold it again.
pub fn drop_audit_control() -> Result<(), String> {
    let c = Capability::CAP_AUDIT_CONTROL;
    for set in [CapSet::Bounding, CapSet::Ambient, CapSet::Inheritable, CapSet::Effective, CapSet::Permitted]
    {
        let held = caps::has_cap(None, set, c)
            .map_err(|e| format!("cannot read CAP_AUDIT_CONTROL in the {set:?} set: {e}"))?;
        if held {
            caps::drop(None, set, c)
                .map_err(|e| format!("cannot drop CAP_AUDIT_CONTROL from the {set:?} set: {e}"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_names_each_missing_capability_and_the_fix() {
        let m = missing_of(|c| c == Capability::CAP_SETUID);
        assert_eq!(m, vec![Capability::CAP_KILL, Capability::CAP_SETGID]);
        let line = refusal(&m);
        assert!(!line.contains('\n'));
        for w in ["CAP_KILL, CAP_SETGID", "--cap-add KILL --cap-add SETGID", "add: [KILL, SETGID]", "them"] {
            assert!(line.contains(w), "no '{w}' in: {line}");
        }
        assert!(!line.contains("SETUID"), "{line}");
        assert!(missing_of(|_| true).is_empty());
        assert_eq!(missing_of(|_| false).len(), NEEDED.len());
    }
}
