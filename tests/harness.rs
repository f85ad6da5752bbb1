//! The harness's own bounds, on the real kernel: a container that outlives its budget is ended
//! by the watchdog, so no test can wait forever on what its sandbox holds.

mod common;
use common::*;
use std::time::{Duration, Instant};

#[test]
fn the_watchdog_ends_a_container_that_outlives_its_budget() {
    let mut c = Container::start(&[], &["sleep", "1000"]);
    assert!(c.alive(), "the container did not start");
    let _w = c.kill_after(Duration::from_millis(300));
    let until = Instant::now() + Duration::from_secs(20);
    while c.alive() {
        assert!(Instant::now() < until, "the watchdog did not end the container within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_dropped_watchdog_leaves_the_container_alone() {
    let mut c = Container::start(&[], &["sleep", "1000"]);
    drop(c.kill_after(Duration::from_millis(100)));
    std::thread::sleep(Duration::from_millis(600));
    assert!(c.alive(), "a dropped watchdog killed the init");
}
