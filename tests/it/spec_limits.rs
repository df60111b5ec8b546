//! The limits tables of the spec against the one source of every default:
//! `tidemark_engine::defaults` (format-spec/storage.md section 13) and
//! `tidemark_node::defaults` with the node's fixed values (protocol.md
//! section 1.8). Every row of either table names a limit this test knows,
//! and its default is the constant's value; `tidemark serve`'s flags take
//! the same constants (checked in `server/src/main.rs`).

use std::collections::BTreeMap;

use tidemark_engine::defaults as engine;
use tidemark_node::defaults as node;

fn spec(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("format-spec")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The rows of the first table of the section that starts with `heading`,
/// as `(name, default)`: the first `code` span of the first column, and the
/// first number of column `default_column` (digits with `,` or space
/// separators; `None` when the cell holds none).
fn table(text: &str, heading: &str, default_column: usize) -> Vec<(String, Option<u64>)> {
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("{heading} not found"));
    let section = &text[start + heading.len()..];
    let section = &section[..section.find("\n#").unwrap_or(section.len())];
    // The first table of the section: its rows after the header and the
    // `|---|` line.
    let table = section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .skip(2)
        .take_while(|l| l.starts_with('|'));
    let mut rows = Vec::new();
    for line in table {
        let cells: Vec<&str> = line.split('|').collect();
        let Some(name) = cells[1].split('`').nth(1) else {
            panic!("row without a `name`: {line}");
        };
        let name = name.to_string();
        let cell = cells[default_column].trim();
        let number: String = cell
            .trim_start_matches(|c: char| !c.is_ascii_digit())
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == ',' || *c == ' ')
            .filter(char::is_ascii_digit)
            .collect();
        rows.push((name, number.parse().ok()));
    }
    assert!(!rows.is_empty(), "no table under {heading}");
    rows
}

fn check(rows: Vec<(String, Option<u64>)>, expected: BTreeMap<&str, Option<u64>>, doc: &str) {
    let mut seen = Vec::new();
    for (name, default) in rows {
        let want = expected
            .get(name.as_str())
            .unwrap_or_else(|| panic!("{doc}: row `{name}` has no constant in this test"));
        assert_eq!(default, *want, "{doc}: default of `{name}`");
        seen.push(name);
    }
    for name in expected.keys() {
        assert!(seen.iter().any(|s| s == name), "{doc}: no row for `{name}`");
    }
}

fn n(v: impl TryInto<u64>) -> Option<u64> {
    Some(v.try_into().ok().expect("fits u64"))
}

/// The `groups_max` row of a limits table states the bytes per group its
/// default divides the memory by, as `tidemark_engine::sizing` has them.
fn sizing_stated(text: &str, doc: &str) {
    let row = text
        .lines()
        .find(|l| l.starts_with("| `groups_max`"))
        .unwrap_or_else(|| panic!("{doc}: no groups_max row"));
    let bytes = format!("{} bytes", tidemark_engine::sizing::SIZED_GROUP_BYTES);
    assert!(
        row.contains(&bytes),
        "{doc}: groups_max row without {bytes}: {row}"
    );
}

#[test]
fn storage_md_limits_are_the_engine_defaults() {
    let expected = BTreeMap::from([
        ("data_dir", None),
        ("fsync", None),
        ("segment_bytes_max", n(engine::SEGMENT_BYTES_MAX)),
        ("small_group_bytes_max", n(engine::SMALL_GROUP_BYTES_MAX)),
        ("index_interval_bytes", n(engine::INDEX_INTERVAL_BYTES)),
        ("payload_bytes_max", n(engine::PAYLOAD_BYTES_MAX)),
        ("open_segments_max", n(engine::OPEN_SEGMENTS_MAX)),
        ("dedup_window_sends", n(engine::DEDUP_WINDOW_SENDS)),
        ("dedup_window_ms", n(engine::DEDUP_WINDOW_MS)),
        ("dedup_entries_max", n(engine::DEDUP_ENTRIES_MAX)),
        (
            "dedup_entries_total_max",
            n(engine::DEDUP_ENTRIES_TOTAL_MAX),
        ),
        ("idle_evict_ms", n(engine::IDLE_EVICT_MS)),
        (
            "checkpoint_journal_bytes",
            n(engine::CHECKPOINT_JOURNAL_BYTES),
        ),
        (
            "checkpoint_dirty_groups_max",
            n(engine::CHECKPOINT_DIRTY_GROUPS_MAX),
        ),
        ("checkpoint_interval_ms", n(engine::CHECKPOINT_INTERVAL_MS)),
        ("run_file_bytes_max", n(engine::RUN_FILE_BYTES_MAX)),
        ("journal_file_bytes", n(engine::JOURNAL_FILE_BYTES)),
        ("commit_round_bytes_max", n(engine::COMMIT_ROUND_BYTES_MAX)),
        // From the memory (`tidemark_engine::sizing`): no number.
        ("groups_max", None),
        ("members_per_group_max", n(engine::MEMBERS_PER_GROUP_MAX)),
        ("groups_per_user_max", n(engine::GROUPS_PER_USER_MAX)),
        ("cursor_flush_ms", n(engine::CURSOR_FLUSH_MS)),
        ("retention_check_ms", n(engine::RETENTION_CHECK_MS)),
        ("change_window_ms", n(engine::CHANGE_WINDOW_MS)),
        ("segment_tail_bytes", n(engine::SEGMENT_TAIL_BYTES)),
        ("disk_free_min_bytes", n(engine::DISK_FREE_MIN_BYTES)),
    ]);
    let text = spec("storage.md");
    let rows = table(&text, "\n## 13. Limits\n", 3);
    check(rows, expected, "storage.md section 13");
    sizing_stated(&text, "storage.md");
}

#[test]
fn protocol_md_limits_are_the_node_and_engine_defaults() {
    let expected = BTreeMap::from([
        ("frame_bytes_max", n(node::FRAME_BYTES_MAX)),
        ("payload_bytes_max", n(engine::PAYLOAD_BYTES_MAX)),
        ("requests_in_flight_max", n(node::REQUESTS_IN_FLIGHT_MAX)),
        // The spec's formula, (frame_bytes_max − 16) / 18.
        ("batch_ack_items_max", n((node::FRAME_BYTES_MAX - 16) / 18)),
        (
            "FRAME_BYTES_MAX_FLOOR",
            n(tidemark_protocol::FRAME_BYTES_MAX_FLOOR),
        ),
        ("connections_max", n(node::CONNECTIONS_MAX)),
        ("output_bytes_max", n(node::OUTPUT_BYTES_MAX)),
        ("output_bytes_total_max", n(node::OUTPUT_BYTES_TOTAL_MAX)),
        ("input_bytes_total_max", n(node::INPUT_BYTES_TOTAL_MAX)),
        ("INPUT_BYTES_FREE", n(tidemark_node::INPUT_BYTES_FREE)),
        ("long_poll_ms_max", n(node::LONG_POLL_MS_MAX)),
        ("subscriptions_max", n(node::SUBSCRIPTIONS_MAX)),
        ("frame_timeout_ms", n(node::FRAME_TIMEOUT_MS)),
        ("FRAMES_PER_PASS_MAX", n(tidemark_node::FRAMES_PER_PASS_MAX)),
        (
            "READ_BYTES_PER_PASS_MAX",
            n(tidemark_node::READ_BYTES_PER_PASS_MAX),
        ),
        ("members_page_max", n(node::MEMBERS_PAGE_MAX)),
        ("receipt_members_max", n(node::RECEIPT_MEMBERS_MAX)),
        ("receipt_interval_ms", n(node::RECEIPT_INTERVAL_MS)),
        ("RECENT_SENDS_MAX", n(tidemark_node::RECENT_SENDS_MAX)),
        ("members_per_group_max", n(engine::MEMBERS_PER_GROUP_MAX)),
        ("groups_per_user_max", n(engine::GROUPS_PER_USER_MAX)),
        // From the memory (`tidemark_engine::sizing`): no number.
        ("groups_max", None),
        ("disk_free_min_bytes", n(engine::DISK_FREE_MIN_BYTES)),
        // The dedup window's row starts with its sends (the rest of the
        // window is checked in storage.md's table).
        ("dedup_window_sends", n(engine::DEDUP_WINDOW_SENDS)),
        (
            "dedup_entries_total_max",
            n(engine::DEDUP_ENTRIES_TOTAL_MAX),
        ),
        ("idle_evict_ms", n(engine::IDLE_EVICT_MS)),
        ("commit_round_bytes_max", n(engine::COMMIT_ROUND_BYTES_MAX)),
        ("cursor_flush_ms", n(engine::CURSOR_FLUSH_MS)),
        ("retention_check_ms", n(engine::RETENTION_CHECK_MS)),
        ("change_window_ms", n(engine::CHANGE_WINDOW_MS)),
        ("slowlog_threshold_us", n(node::SLOWLOG_THRESHOLD_US)),
        ("slowlog_entries_max", n(node::SLOWLOG_ENTRIES_MAX)),
        (
            "checkpoint_journal_bytes",
            n(engine::CHECKPOINT_JOURNAL_BYTES),
        ),
        ("checkpoint_interval_ms", n(engine::CHECKPOINT_INTERVAL_MS)),
    ]);
    let text = spec("protocol.md");
    let rows = table(&text, "\n### 1.8 Limits\n", 2);
    check(rows, expected, "protocol.md section 1.8");
    sizing_stated(&text, "protocol.md");
    // The serve options the table leaves to storage.md, in the prose below it.
    let spaced = |v: u64| {
        let digits = v.to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(' ');
            }
            out.push(c);
        }
        out
    };
    for (flag, value) in [
        ("--open-segments-max", n(engine::OPEN_SEGMENTS_MAX)),
        ("--segment-bytes-max", n(engine::SEGMENT_BYTES_MAX)),
        ("--small-group-bytes-max", n(engine::SMALL_GROUP_BYTES_MAX)),
    ] {
        let want = format!("`{flag}` (default\n{}", spaced(value.unwrap()));
        let want_one_line = want.replace('\n', " ");
        assert!(
            text.contains(&want) || text.contains(&want_one_line),
            "protocol.md 1.8 does not state {want_one_line}"
        );
    }
    assert!(text.contains(&format!("default\n`{}`", node::DATA_DIR)));
    assert!(text.contains(&format!("default `{}`", node::LISTEN)));
}

/// At the smallest legal `frame_bytes_max` STATS still answers, with every
/// `limits.*` gauge a client reads after the handshake (protocol.md 1.8,
/// 4.4): the names that do not fit are left out and counted in
/// `server.stats_omitted`. Before, once a few opcodes had been used the
/// answer passed 4096 bytes and was refused with LIMIT_EXCEEDED.
#[test]
fn stats_fits_the_smallest_frame_and_keeps_every_limit() {
    let dir = tempfile::tempdir().unwrap();
    let node = crate::harness::Node::start(
        dir.path(),
        &["--frame-bytes-max", "4096", "--payload-bytes-max", "1024"],
    );
    let mut c = node.client();
    c.create_group(1).unwrap();
    c.join(1, 2, tidemark_client::protocol::JoinStart::Earliest)
        .unwrap();
    c.send(1, 2, 1, b"x").unwrap();
    c.pull(1, 2, 0, 10, 0).unwrap();
    c.ack(1, 2, 1).unwrap();
    c.unread(2).unwrap();
    c.history(1, 2, 0, 10).unwrap();
    c.read_count(1, 1).unwrap();
    c.group_info(1).unwrap();
    c.ping().unwrap();
    let stats: BTreeMap<String, u64> = c.stats().expect("STATS answers").into_iter().collect();
    let limits: Vec<&String> = stats.keys().filter(|n| n.starts_with("limits.")).collect();
    assert!(limits.len() >= 20, "{limits:?}");
    assert_eq!(stats.get("limits.frame_bytes_max"), Some(&4096));
    assert!(
        stats.get("server.stats_omitted").is_some_and(|&n| n > 0),
        "names were left out and counted: {stats:?}"
    );
    // With the default frame, every name: nothing omitted.
    let dir = tempfile::tempdir().unwrap();
    let node = crate::harness::Node::start(dir.path(), &[]);
    let mut c = node.client();
    c.ping().unwrap();
    let stats: BTreeMap<String, u64> = c.stats().unwrap().into_iter().collect();
    assert_eq!(stats.get("server.stats_omitted"), Some(&0));
}
