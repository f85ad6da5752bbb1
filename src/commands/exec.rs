//! `quiesce exec`: start a command as a sandbox user, tagged so the init recognises its lineage.

use crate::cli::ExecArgs;
use crate::spawn::{self, Plan};
use crate::users;

pub fn exec(args: ExecArgs) -> i32 {
    let pw = users::read_passwd();
    let user = match users::resolve(&args.user, &pw) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("quiesce exec: {e}");
            return 2;
        }
    };
    let groups = users::groups_of(&user, &users::read_group());
    if !args.no_lineage && !spawn::tag_lineage(user.uid) {
        log::info!("audit lineage unavailable here; the init tracks this launch by history instead");
    }
    let drop = spawn::Drop { user, groups, allow_setuid: args.allow_setuid, tag: false };
    match Plan::new(&args.command, Some(drop)) {
        Ok(plan) => plan.exec_in_place(),
        Err(e) => {
            eprintln!("quiesce exec: {e}");
            2
        }
    }
}
