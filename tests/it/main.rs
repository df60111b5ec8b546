//! End-to-end tests of tidemark.
//!
//! All of them live in this one integration-test binary, one module per
//! subject: every file directly under `tests/` would be a separate binary to
//! link, and on two cores one binary builds much faster. Slow modes are
//! switched on by environment variables documented in each module (no
//! `#[ignore]`).

mod background_load;
mod backup;
mod bench_tool;
mod cli;
mod cluster;
mod cluster_faults;
mod cluster_health;
mod cluster_kill_cycles;
mod cluster_membership;
mod cluster_reads;
mod cluster_snapshot;
mod crash_kill;
mod ctl;
mod disk_full;
mod erasure;
mod event_loop;
mod faulty_set;
mod first_use;
mod fuzz_corpus;
mod harness;
mod history_check;
mod hostile;
mod hostile_peer;
mod idle;
mod layers;
mod members;
mod net_faults;
mod netns;
mod netns_faults;
mod node;
mod observe;
mod ops_cli;
mod ops_pipelined;
mod progress_off;
mod proxy;
mod recall;
mod receipts;
mod retention;
mod segment_damage;
mod service;
mod shards;
mod shared_file_damage;
mod spec_limits;
mod storage_format;
mod torture;
mod workspace;
