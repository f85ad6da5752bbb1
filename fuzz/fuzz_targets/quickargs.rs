#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| quiesce::fuzz::quickargs(data));
