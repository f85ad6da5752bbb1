//! `quiesce keygen`: write a signing key pair for `--signing-key` and `quiesce verify --key`.

use crate::cli::args::KeygenArgs;
use crate::state;
use std::os::unix::fs::PermissionsExt;

pub fn keygen(args: KeygenArgs) -> i32 {
    let run = || -> Result<(), String> {
        if !args.out.exists() {
            std::fs::create_dir_all(&args.out)
                .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
            std::fs::set_permissions(&args.out, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("cannot chmod {}: {e}", args.out.display()))?;
        }
        let key = crate::marker::jws::generate().map_err(|e| e.to_string())?;
        let priv_pem = crate::marker::jws::private_pem(&key);
        let pub_pem = crate::marker::jws::public_pem(&key.verifying_key());
        state::dir::write_atomic(&args.out, "signing.key", priv_pem.as_bytes(), 0o600)
            .map_err(|e| format!("signing.key: {e}"))?;
        state::dir::write_atomic(&args.out, "signing.pub", pub_pem.as_bytes(), 0o644)
            .map_err(|e| format!("signing.pub: {e}"))?;
        Ok(())
    };
    match run() {
        Ok(()) => {
            eprintln!("quiesce keygen: wrote {0}/signing.key and {0}/signing.pub", args.out.display());
            0
        }
        Err(e) => {
            eprintln!("quiesce keygen: {e}");
            1
        }
    }
}
