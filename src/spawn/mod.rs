//! Starting a command, for the init (its command) and the client subcommands alike (`quiesce
//! exec`, the verifier, the handed-over services): PATH lookup, a clean signal state, a drop to
//! a user, the lineage tag, a session, a Landlock domain, and exec (plan).
//! May use: kernel only. Between fork and exec only async-signal-safe calls run (raw syscalls on
//! what the plan prepared), which is why some calls are made here and not through a kernel
//! module's wrapper; a failure the child meets is handed back, never printed from it.

pub mod plan;
