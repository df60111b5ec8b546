#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tidemark_protocol::fuzz_targets::frame_decoder(data));
