#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tidemark_engine::fuzz_targets::cold_scan(data));
