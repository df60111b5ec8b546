//! `tidemark bench` end to end: every workload at a tiny scale against a
//! node it spawns, each result's verification checked (ids dense, delivered
//! totals, cursors read back, unread counts against the model, no message
//! missed by an online or offline member in the mixed workload).

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
        "--data-dir",
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
