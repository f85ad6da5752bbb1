//! The proof: an observation taken after the last kill, consistent (no process created while it
//! was taken escapes it), that finds no sandbox process alive; what it still finds is killed again
//! and the freeze looks again, within the budget. The failure texts here are status reasons that
//! callers and tests match on: they stay word for word.

use crate::freeze::kill::Reach;
use crate::freeze::orphans::Vouched;
use crate::freeze::progress::{ms, survivors, Run};
use crate::freeze::run::{Context, Outcome, Reap};
use crate::kernel::process::{self, Pid};
use crate::observe::consistency::{self, Observed};
use crate::observe::procs::table::Table;
use crate::record::freeze::Survivor;
use std::io;
use std::time::{Duration, Instant};

/// The pause between two looks of the proof: 1 ms at first, doubled after each look up to 20 ms.
struct Backoff(Duration);

impl Backoff {
    fn new() -> Backoff {
        Backoff(Duration::from_millis(1))
    }

    fn sleep(&mut self) {
        std::thread::sleep(self.0);
        self.0 = (self.0 * 2).min(Duration::from_millis(20));
    }
}

/// A look of the proof that found no consistent table.
enum Unproven {
    /// Look again after a pause.
    Again,
    /// The freeze fails: why, and what the last complete observation found alive.
    Fails(String, Vec<Survivor>),
}

impl Run<'_> {
    /// Look, and kill again what is still alive, until a look finds no sandbox process alive and
    /// a parent that vouches for every process born during the freeze, or the budget runs out.
    /// `walked`: the identities the walk recorded, sorted. `budget`: the freeze's, as its failure
    /// texts name it.
    pub fn prove(
        mut self,
        table: &mut Table,
        walked: &[(Pid, u64)],
        ctx: &Context,
        budget: Duration,
    ) -> Outcome {
        let t = Instant::now();
        let mut pause = Backoff::new();
        let mut rounds = 0u32;
        let mut first_orphans: Option<Instant> = None;
        // The survivors of the last complete observation, for a pass the budget cuts off.
        let mut last_left: Vec<Survivor> = Vec::new();
        loop {
            // The proof: a consistent observation taken after the last kill, read into the table.
            let observed = consistency::observe(self.reader, table, self.deadline);
            let passes = match self.consistent(observed, budget, rounds, &mut last_left) {
                Ok(passes) => passes,
                Err(Unproven::Again) => {
                    pause.sleep();
                    continue;
                }
                Err(Unproven::Fails(why, named)) => {
                    self.phases.probe = ms(t.elapsed());
                    return self.fail(why, named);
                }
            };
            let snap = &*table;
            let tainted = self.policy.classify(snap);
            self.policy.remember(snap, &tainted);
            self.ancestry.note(snap, &tainted, process::getpid());
            log::debug!("proof: consistent after {passes} pass(es)");
            let left = survivors(snap, &tainted);
            if left.is_empty() {
                self.phases.probe = ms(t.elapsed());
                match self.vouched(snap, &tainted, ctx, &mut first_orphans) {
                    Vouched::All => return self.succeed(left),
                    Vouched::Again => {
                        pause.sleep();
                        continue;
                    }
                    Vouched::Refused(why, found) => return self.fail(why, found),
                }
            }
            self.late_evidence(snap, &tainted, walked);
            last_left = left.clone();
            rounds += 1;
            if Instant::now() >= self.deadline {
                self.phases.probe = ms(t.elapsed());
                return self.fail(still_alive(left.len(), budget, rounds), left);
            }
            if let Err(e) = self.kill_channels(snap, &tainted, Reach::All) {
                return self.fail(e, left);
            }
            self.reap.reap_batch();
            pause.sleep();
        }
    }

    /// The passes of a consistent observation; or, where the observation is not one, whether to
    /// look again (after reaping: nothing could hold the pid counter) or fail, and why.
    fn consistent(
        &mut self,
        observed: io::Result<Observed>,
        budget: Duration,
        rounds: u32,
        last_left: &mut Vec<Survivor>,
    ) -> Result<usize, Unproven> {
        let verdict = judge(observed, Instant::now() < self.deadline, budget, rounds, last_left);
        if let Err(Unproven::Again) = verdict {
            // No pid free for a thread to hold the counter with: the sandbox held a pids limit,
            // and what the kill left holds those pids as zombies until the init reaps them.
            // Reaping frees them; the next observation starts over from a full listing.
            reap_for_a_look(self.reap, self.deadline);
        }
        verdict
    }
}

/// What one look's observation means for the proof. `in_time`: the budget is not spent.
/// `last_left`: what the last complete observation found alive, taken when the look fails for
/// lack of time (it is what is known of now).
fn judge(
    observed: io::Result<Observed>,
    in_time: bool,
    budget: Duration,
    rounds: u32,
    last_left: &mut Vec<Survivor>,
) -> Result<usize, Unproven> {
    match observed {
        Ok(Observed::Consistent { passes }) => Ok(passes),
        Ok(Observed::Unheld) if in_time => Err(Unproven::Again),
        Ok(Observed::Unheld) => Err(Unproven::Fails(unheld(budget), Vec::new())),
        Ok(Observed::Churn { created, passes }) => {
            Err(Unproven::Fails(churned(created, passes, budget), Vec::new()))
        }
        Err(e) if e.kind() == io::ErrorKind::TimedOut => {
            if !last_left.is_empty() {
                let why = still_alive(last_left.len(), budget, rounds);
                return Err(Unproven::Fails(why, std::mem::take(last_left)));
            }
            Err(Unproven::Fails(cut_off(&e, budget), Vec::new()))
        }
        Err(e) => Err(Unproven::Fails(format!("/proc unreadable: {e}"), Vec::new())),
    }
}

/// Reap what the init's children left, up to 64 batches, while any is waiting and the budget
/// lasts. The batches reaped.
fn reap_for_a_look(reap: &mut dyn Reap, deadline: Instant) -> usize {
    let mut batches = 0;
    let mut more = true;
    for _ in 0..64 {
        if !more || Instant::now() >= deadline {
            break;
        }
        more = reap.reap_batch();
        batches += 1;
    }
    batches
}

/// Sandbox processes alive when the budget ran out.
fn still_alive(n: usize, budget: Duration, rounds: u32) -> String {
    format!("{n} sandbox process(es) still alive after the {budget:?} budget ({rounds} kill rounds)")
}

/// No observation could be shown consistent: nothing could hold the pid counter until the end.
fn unheld(budget: Duration) -> String {
    format!(
        "no pid was free to hold the pid counter with (a pids limit reached; the init \
         reaped its exited children meanwhile) within the {budget:?} budget: the final \
         observation cannot be shown consistent, and what is alive is unknown"
    )
}

/// Processes kept being created through the last pass of the final observation (`created`:
/// None when the counter went round).
fn churned(created: Option<u64>, passes: usize, budget: Duration) -> String {
    let n = created.map_or_else(|| "many".to_string(), |c| c.to_string());
    format!(
        "processes kept appearing: {n} pid(s) created during the last of {passes} passes \
             of the final observation, within the {budget:?} budget"
    )
}

/// The final observation was cut off by the budget before it ended.
fn cut_off(e: &io::Error, budget: Duration) -> String {
    format!(
        "the final observation did not end within the {budget:?} budget ({e}): what is alive is \
         unknown; freeze again once the machine is less loaded, or raise --freeze-timeout"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn survivor(pid: Pid) -> Survivor {
        Survivor { pid, uid: 4242, comm: "x".into(), state: 'R' }
    }

    fn fails(v: Result<usize, Unproven>) -> (String, Vec<Pid>) {
        match v {
            Err(Unproven::Fails(why, named)) => (why, named.iter().map(|s| s.pid).collect()),
            Err(Unproven::Again) => panic!("looks again"),
            Ok(p) => panic!("proven after {p} passes"),
        }
    }

    #[test]
    fn only_a_consistent_observation_proves_and_each_other_fails_saying_why() {
        let b = Duration::from_secs(5);
        let mut left = Vec::new();
        assert!(matches!(judge(Ok(Observed::Consistent { passes: 3 }), true, b, 0, &mut left), Ok(3)));
        assert!(matches!(judge(Ok(Observed::Unheld), true, b, 0, &mut left), Err(Unproven::Again)));
        let (why, named) = fails(judge(Ok(Observed::Unheld), false, b, 0, &mut left));
        assert!(why.starts_with("no pid was free to hold the pid counter") && why.contains("5s"), "{why}");
        assert!(named.is_empty());
        for (created, n) in [(Some(7), "7 pid(s)"), (None, "many pid(s)")] {
            let (why, _) = fails(judge(Ok(Observed::Churn { created, passes: 4 }), true, b, 0, &mut left));
            assert!(why.starts_with("processes kept appearing: ") && why.contains(n), "{why}");
            assert!(why.contains("last of 4 passes") && why.contains("5s budget"), "{why}");
        }
        let cut = || Err(io::Error::new(io::ErrorKind::TimedOut, "one pass did not end"));
        let (why, named) = fails(judge(cut(), true, b, 0, &mut left));
        assert!(why.starts_with("the final observation did not end within the 5s budget"), "{why}");
        assert!(why.contains("one pass did not end") && named.is_empty(), "{why}");
        let mut left = vec![survivor(10), survivor(11)];
        let (why, named) = fails(judge(cut(), true, b, 3, &mut left));
        assert_eq!(why, "2 sandbox process(es) still alive after the 5s budget (3 kill rounds)");
        assert_eq!((named, left.len()), (vec![10, 11], 0));
        let gone = Err(io::Error::new(io::ErrorKind::NotFound, "no /proc"));
        let (why, _) = fails(judge(gone, true, b, 0, &mut vec![survivor(10)]));
        assert_eq!(why, "/proc unreadable: no /proc");
    }

    struct Zombies(usize);

    impl Reap for Zombies {
        fn reap_batch(&mut self) -> bool {
            self.0 = self.0.saturating_sub(1);
            self.0 > 0
        }
    }

    #[test]
    fn a_look_reaps_while_batches_wait_within_the_budget_and_at_most_64() {
        let later = Instant::now() + Duration::from_secs(60);
        assert_eq!(reap_for_a_look(&mut Zombies(3), later), 3);
        assert_eq!(reap_for_a_look(&mut Zombies(1000), later), 64);
        assert_eq!(reap_for_a_look(&mut Zombies(3), Instant::now()), 0);
    }
}
