#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| quiesce::fuzz::sandbox_json(data));
