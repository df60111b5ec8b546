#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tidemark_cluster::fuzz_targets::peer_handshake(data));
