#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| quiesce::fuzz::proc_net_tcp(data));
