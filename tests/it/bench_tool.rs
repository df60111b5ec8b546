//! `tidemark bench` end to end: every workload at a tiny scale against a
//! node it spawns, each result's verification checked (ids dense, delivered
//! totals, cursors read back, unread counts against the model, no message
//! missed by an online or offline member in the mixed workload; the
//! population workload's figures, and its read-back after both restarts).

use tidemark_server::bench::{run_workloads, BenchArgs, JsonValue as Value};

use crate::harness::tidemark_bin;

fn run(flags: &[&str]) -> Vec<Value> {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = tidemark_bin().to_str().expect("utf-8 path").to_string();
    let data = dir.path().to_str().expect("utf-8 path").to_string();
    let mut all = vec![
        "--spawn",
        "--node-bin",
        &bin,
        "--data",
        &data,
        "--json",
        "--quiet",
        "--connections",
        "3",
        "--in-flight",
        "4",
    ];
    all.extend_from_slice(flags);
    let args = BenchArgs::parse_flags(all).expect("flags parse");
    run_workloads(&args).expect("bench runs")
}

fn check(r: &Value, workload: &str, ops: u64) {
    assert_eq!(r["workload"], workload, "{r:#}");
    assert_eq!(r["verified"], true, "{r:#}");
    assert_eq!(r["errors"], 0, "{r:#}");
    assert_eq!(r["ops"], ops, "{r:#}");
    assert!(
        r["latency_us"]["p50"].as_u64().is_some_and(|p| p > 0),
        "{r:#}"
    );
    assert!(r["latency_us"]["max"].as_u64() >= r["latency_us"]["p99"].as_u64());
    assert!(r["ops_per_sec"].as_f64().is_some_and(|x| x > 0.0), "{r:#}");
}

#[test]
fn every_workload_verifies_at_a_tiny_scale() {
    // W1 and W2 with fsync=always; W3, W4 and mixed with fsync=never.
    let r = run(&[
        "-w",
        "w1,w2",
        "--fsync",
        "always",
        "--groups",
        "20",
        "--messages",
        "600",
        "--members",
        "30",
        "--page",
        "7",
    ]);
    assert_eq!(r.len(), 2);
    check(&r[0], "w1", 600);
    let expected = tidemark_server::bench::plan::w2_expected(
        tidemark_server::bench::plan::SEED_DEFAULT,
        600,
        30,
    );
    check(&r[1], "w2", expected);
    assert_eq!(r[1]["mb_per_sec"].as_f64().map(|x| x > 0.0), Some(true));

    let r = run(&[
        "-w",
        "w3,w4,mixed",
        "--fsync",
        "never",
        "--groups",
        "12",
        "--members",
        "200",
        "--messages",
        "300",
        "--ops",
        "500",
        "--groups-per-user",
        "5",
        "--group-size-max",
        "150",
        "--catchup-users",
        "20",
        "--online",
        "0.3",
        "--page",
        "5",
    ]);
    assert_eq!(r.len(), 3);
    check(&r[0], "w3", 500);
    check(&r[1], "w4", 500);
    check(&r[2], "mixed", 300);
    assert!(
        r[2]["push_records"].as_u64().is_some_and(|n| n > 0),
        "{:#}",
        r[2]
    );
    assert!(
        r[2]["catchup_deliveries"].as_u64().is_some_and(|n| n > 0),
        "{:#}",
        r[2]
    );
}

#[test]
fn duration_cuts_the_measured_phase_and_still_verifies() {
    let r = run(&[
        "-w",
        "w1",
        "--fsync",
        "never",
        "--groups",
        "5",
        "--messages",
        "100000000",
        "--duration",
        "0.5",
    ]);
    assert_eq!(r[0]["cut_short"], true, "{:#}", r[0]);
    assert_eq!(r[0]["verified"], true, "{:#}", r[0]);
    assert!(r[0]["ops"]
        .as_u64()
        .is_some_and(|n| n > 0 && n < 100_000_000));
}

/// The population workload at a tiny scale: every figure of its
/// JSON is there (names documented in BENCHMARKS.md) and its validation
/// passed after the clean and the crash restart. No timing is asserted.
#[test]
fn population_reports_every_figure_and_validates() {
    let r = run(&[
        "-w",
        "population",
        // A SIGKILL keeps what was written, so `never` checks the same
        // promise at the kill; `always` would make the joins slow here.
        "--fsync",
        "never",
        "--groups",
        "1000",
        "--messages",
        "4000",
        "--group-size-max",
        "1500",
        "--node-idle-evict-ms",
        "300",
        // New groups go idle after the first checkpoint: sooner here.
        "--node-checkpoint-interval-ms",
        "1000",
    ]);
    assert_eq!(r.len(), 1);
    let r = &r[0];
    check(r, "population", 4000);
    let number = |path: &str| {
        let v = path.split('.').fold(r, |v, k| &v[k]);
        assert!(v.is_number(), "{path} is not a number: {r:#}");
        v.as_f64().unwrap_or(0.0)
    };
    assert_eq!(number("population.groups"), 1000.0);
    assert_eq!(number("population.big_groups"), 1.0);
    assert!(number("population.memberships") > 2000.0);
    for path in [
        "population.users",
        "population.pair_groups",
        "population.mid_groups",
        "population.largest_group",
        "population.memberships_per_group",
        "create.groups",
        "create.secs",
        "create.groups_per_sec",
        "join.memberships",
        "join.secs",
        "join.joins_per_sec",
        "disk.empty.bytes",
        "disk.empty.inodes",
        "disk.after_create.bytes",
        "disk.after_create.inodes",
        "disk.after_join.bytes",
        "disk.after_join.inodes",
        "disk.after_send.bytes",
        "disk.after_send.inodes",
        "disk.bytes_per_group",
        "disk.inodes_per_group",
        "disk.bytes_per_membership",
        "memory.empty.rss_bytes",
        "memory.empty.anon_bytes",
        "memory.after_create.rss_bytes",
        "memory.after_join.rss_bytes",
        "memory.after_send.rss_bytes",
        "memory.after_clean_restart.rss_bytes",
        "memory.after_crash_restart.rss_bytes",
        "memory.rss_bytes_per_group",
        "memory.rss_bytes_per_membership",
        "memory.anon_bytes_per_group",
        "memory.anon_bytes_per_membership",
        "memory.before_settle.after_create.rss_bytes",
        "memory.before_settle.after_join.rss_bytes",
        "memory.settle.after_create.secs",
        "memory.settle.after_create.groups_in_use",
        "memory.settle.after_create.checkpoints",
        "memory.settle.after_join.secs",
        "memory.settle.after_join.groups_in_use",
        "send.messages",
        "send.groups_touched",
        "send.commit_rounds",
        "send.fsyncs",
        "send.group_loads",
        "send.requests_waited_for_load",
        "checkpoints.count",
        "checkpoints.bytes",
        "checkpoints.bytes_max",
        "checkpoints.journal_bytes",
        "checkpoints.send_phase.count",
        "checkpoints.send_phase.bytes",
        "checkpoints.send_phase.journal_bytes",
        "restart.clean_stop_secs",
        "restart.clean_restart_secs",
        "restart.crash_load_sends_acknowledged",
        "restart.crash_kill_after_acknowledged",
        "restart.crash_restart_secs",
        "validation.after_clean_restart.groups_checked",
        "validation.after_clean_restart.acknowledged_sends_checked",
        "validation.after_clean_restart.records_read",
        "validation.after_clean_restart.secs",
        "validation.after_crash_restart.groups_checked",
        "validation.after_crash_restart.acknowledged_sends_checked",
        "validation.after_crash_restart.records_read",
        "validation.after_crash_restart.secs",
        "node_disk_bytes",
    ] {
        number(path);
    }
    // This build's node has `--idle-evict-ms`: it ran with the bench's
    // idle time, and memory was read after waiting for idle groups.
    assert_eq!(number("memory.settle.idle_evict_ms"), 300.0);
    // Creating groups and joining members costs something on any engine.
    assert!(number("disk.after_join.bytes") > number("disk.empty.bytes"));
    assert!(number("checkpoints.journal_bytes") > 0.0);
    // The ratios exist once the journal has bytes (null only when the node
    // does not report the counters).
    number("checkpoints.bytes_per_journal_byte");
    assert_eq!(number("validation.after_clean_restart.faults"), 0.0);
    assert_eq!(number("validation.after_crash_restart.faults"), 0.0);
    assert_eq!(
        number("validation.after_clean_restart.acknowledged_sends_checked"),
        4000.0
    );
    assert!(number("restart.crash_load_sends_acknowledged") >= 400.0);
    assert_eq!(
        number("validation.after_crash_restart.acknowledged_sends_checked"),
        4000.0 + number("restart.crash_load_sends_acknowledged")
    );
}

/// The receipts workload at a tiny scale, in both modes: above
/// the node's threshold (counts: RECEIPT_COUNTS only) and, with the
/// spawned node's threshold raised above the group, list receipts (RECEIPT
/// only). Both runs verify, and the ratio of their throughputs is reported.
#[test]
fn receipts_workload_reports_both_runs_in_both_modes() {
    let common = [
        "-w",
        "receipts",
        "--fsync",
        "never",
        "--members",
        "1500",
        "--messages",
        "100",
        "--ops",
        "3000",
        "--receipt-subscribers",
        "2",
    ];
    for list in [false, true] {
        let mut flags = common.to_vec();
        if list {
            flags.extend(["--node-receipt-members-max", "5000"]);
        }
        let r = run(&flags);
        let r = &r[0];
        check(r, "receipts", 3000);
        let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k}: {r:#}"));
        assert!(r["throughput_ratio"].as_f64().is_some_and(|x| x > 0.0));
        assert!(r["baseline_acks_per_sec"].as_f64().is_some_and(|x| x > 0.0));
        let (lists, counts) = (n("receipt_frames"), n("receipt_counts_frames"));
        if list {
            assert!(lists > 0 && counts == 0, "{r:#}");
            assert!(n("receipt_entries") >= lists, "{r:#}");
        } else {
            assert!(counts > 0 && lists == 0, "{r:#}");
        }
        assert_eq!(n("node_receipt_frames"), lists + counts, "{r:#}");
    }
}

/// `--ops` sizes only the workloads that measure operations (w3, w4,
/// receipts): with w1 alone it is refused, naming what sizes w1, rather
/// than silently running a million sends.
#[test]
fn ops_is_refused_where_no_workload_measures_operations() {
    let args = BenchArgs::parse_flags(vec!["-w", "w1", "--ops", "2000"]).expect("flags parse");
    let e = run_workloads(&args).expect_err("refused");
    assert!(e.contains("--ops") && e.contains("--messages"), "{e}");
}

/// `bench --data DIR` is the spelling every command uses for a data
/// directory; `--data-dir` is its deprecated spelling, still accepted.
#[test]
fn bench_takes_data_and_still_data_dir() {
    for flag in ["--data", "--data-dir"] {
        let args = BenchArgs::parse_flags(vec!["--spawn", flag, "/tmp/x"]).expect("flags parse");
        assert_eq!(
            args.data_dir.as_deref(),
            Some(std::path::Path::new("/tmp/x")),
            "{flag}"
        );
    }
}

/// The joins workload at a tiny scale: every JOIN answered and counted
/// among its group's members.
#[test]
fn joins_workload_verifies_at_a_tiny_scale() {
    let r = run(&[
        "-w", "joins", "--fsync", "never", "--groups", "7", "--ops", "500",
    ]);
    check(&r[0], "joins", 500);
    assert!(
        r[0]["commit"]
            .as_str()
            .is_some_and(|c| c.contains("500 joins")),
        "{:#}",
        r[0]
    );
}
