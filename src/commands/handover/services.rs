//! Which services a hand-over starts, and from what: each recorded listener not covered by an
//! earlier one (a worker sharing its master's socket), only those on the ports `--port` names,
//! with the task's declared starts (`--service PORT=COMMAND`) in place of those on their ports;
//! a record too incomplete to start again from is a refusal naming the start to declare.

use crate::marker::jws::Claims;
use crate::record::evidence::{Evidence, Service};
use serde::Serialize;

/// The environment a declared service gets.
const PLAIN_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// One service as started, for the record.
#[derive(Debug, Serialize)]
pub struct Started {
    /// The killed process it stands for; None: declared for a port nothing listened on.
    pub was_pid: Option<i32>,
    pub argv: Vec<String>,
    pub exe: String,
    /// sha256 of the executable file as it was when started (a script's interpreter: the
    /// attestation covers the scripts of the trees it names).
    pub exe_sha256: Option<String>,
    pub cwd: String,
    /// The names of its environment's variables (their values may be secrets).
    pub env_names: Vec<String>,
    /// The ports it alone may bind (the first service naming a port owns it), and must listen on.
    pub ports: Vec<u16>,
    /// Started from `--service PORT=COMMAND`, not from its record.
    pub declared: bool,
    pub pid: Option<i32>,
    /// The audit session its processes carry (of several services, each is told by its own).
    pub audit_session: Option<u32>,
    /// The environment it is started with (not recorded: values may be secrets).
    #[serde(skip)]
    pub env: Vec<String>,
}

/// The services to start: each recorded one not already covered by an earlier one (a worker
/// sharing its master's socket), with the declared ones in place of those on their ports.
pub fn services(claims: &Claims, declared: &[String], named: &[u16]) -> Result<Vec<Started>, String> {
    let mut decl: Vec<(u16, &str)> = Vec::new();
    for d in declared {
        let parsed = d.split_once('=').and_then(|(p, c)| Some((p.trim().parse::<u16>().ok()?, c)));
        match parsed {
            Some((p, c)) if p > 0 && !c.trim().is_empty() => decl.push((p, c)),
            _ => return Err(format!("--service '{}' is not PORT=COMMAND", d.escape_debug())),
        }
    }
    let mut recorded: Vec<&Service> = claims.services.iter().collect();
    recorded.sort_by_key(|s| s.start_time);
    let mut out: Vec<Started> = Vec::new();
    for s in recorded {
        let ports: Vec<u16> = s.listen.iter().map(|e| e.port).collect();
        if ports.iter().all(|p| out.iter().any(|o| o.ports.contains(p))) {
            continue;
        }
        // With --port, only the services on the ports named come back: one the agent left on a
        // port the tests bind themselves stays dead.
        if !named.is_empty() && !ports.iter().any(|p| named.contains(p)) {
            continue;
        }
        if let Some(p) = ports.iter().find(|p| !named.is_empty() && !named.contains(p)) {
            return Err(format!(
                "the service pid {} listened on port {p} as well as on a port --port names: it cannot \
                 come back without it; declare its start with --service",
                s.pid
            ));
        }
        let evidence = claims.processes.iter().find(|e| (e.pid, e.start_time) == (s.pid, s.start_time));
        let own = decl.iter().find(|(p, _)| ports.contains(p));
        let mut started = match own {
            Some(&(_, cmd)) => declared_start(cmd),
            None => recorded_start(s, evidence)?,
        };
        started.was_pid = Some(s.pid);
        // A port is the first service's that names it: only that one may bind it.
        for p in ports {
            if !started.ports.contains(&p) && !out.iter().any(|o| o.ports.contains(&p)) {
                started.ports.push(p);
            }
        }
        out.push(started);
    }
    for &(p, cmd) in &decl {
        if !out.iter().any(|o| o.ports.contains(&p)) {
            let mut s = declared_start(cmd);
            s.ports.push(p);
            out.push(s);
        }
    }
    Ok(out)
}

/// The task's own start: from `/` with a plain PATH, never the agent's recorded directory or
/// environment (whose PATH could lead the task's command to the agent's files).
fn declared_start(cmd: &str) -> Started {
    let env = vec![PLAIN_ENV.to_string()];
    Started {
        was_pid: None,
        argv: vec!["/bin/sh".into(), "-c".into(), cmd.to_string()],
        exe: "/bin/sh".into(),
        exe_sha256: None,
        cwd: "/".to_string(),
        env_names: names(&env),
        ports: Vec::new(),
        declared: true,
        pid: None,
        audit_session: None,
        env,
    }
}

/// A recorded service as it ran, or the reason it cannot be started again from its record.
fn recorded_start(s: &Service, e: Option<&Evidence>) -> Result<Started, String> {
    let ports: Vec<String> = s.listen.iter().map(|l| l.port.to_string()).collect();
    let why = |what: &str| {
        format!(
            "the service pid {} on port {} cannot be started again: {what}; declare its start with \
             --service {}=COMMAND",
            s.pid,
            ports.join(","),
            ports.first().map(String::as_str).unwrap_or("PORT")
        )
    };
    let e = e.ok_or_else(|| why("its process is not in the marker"))?;
    let argv = match (&e.cmdline, e.truncated || s.truncated) {
        (_, true) => return Err(why("its record was cut to its bound")),
        (Some(a), false) if !a.is_empty() => a.clone(),
        _ => return Err(why("its command line was not recorded")),
    };
    let exe = match &e.exe {
        Some(x) if x.ends_with(" (deleted)") => return Err(why("its executable was deleted")),
        Some(x) => x.clone(),
        None => return Err(why("its executable was not recorded")),
    };
    let cwd = s.cwd.clone().ok_or_else(|| why("its working directory was not recorded"))?;
    if cwd.ends_with(" (deleted)") {
        return Err(why("its working directory was deleted"));
    }
    let env = s.env.clone().ok_or_else(|| why("its environment was not recorded"))?;
    Ok(Started {
        was_pid: Some(s.pid),
        argv,
        exe,
        exe_sha256: None,
        cwd,
        env_names: names(&env),
        ports: Vec::new(),
        declared: false,
        pid: None,
        audit_session: None,
        env,
    })
}

fn names(env: &[String]) -> Vec<String> {
    env.iter().map(|v| v.split_once('=').map_or(v.as_str(), |(n, _)| n).to_string()).collect()
}
