//! Ties the codec to format-spec/protocol.md: every vector in
//! format-spec/vectors/protocol/ decodes to the values its comments state
//! and re-encodes to the same bytes. Then robustness: every truncation is a
//! clean error, mutated and random bytes never panic, and whatever decodes
//! re-encodes byte for byte (the encoding is canonical).

use tidemark_engine::record::{self, NewRecord};

use super::*;

/// Parses a vector file: `#` lines are comments, the rest whitespace-separated
/// hex bytes.
fn parse_hex(text: &str) -> Vec<u8> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .flat_map(str::split_whitespace)
        .map(|t| u8::from_str_radix(t, 16).expect("vector files hold hex bytes"))
        .collect()
}

/// A storage record built by the engine itself, so the vectors' records are
/// checked against the real record layout.
fn rec(
    msg_id: u64,
    timestamp_ms: u64,
    sender_id: u64,
    client_msg_id: u64,
    payload: &[u8],
) -> Vec<u8> {
    let mut out = Vec::new();
    record::encode_into(
        &NewRecord {
            msg_id,
            timestamp_ms,
            sender_id,
            client_msg_id,
            payload,
        },
        &mut out,
    );
    out
}

fn records(bytes: &[u8]) -> Records<'_> {
    Records::from_bytes(bytes).unwrap()
}

enum Expected<'a> {
    Req(u64, Request<'a>),
    Resp(u64, Response<'a>),
}

macro_rules! vector {
    ($name:literal) => {
        (
            $name,
            include_str!(concat!(
                "../../../format-spec/vectors/protocol/",
                $name,
                ".hex"
            )),
        )
    };
}

const VECTORS: &[(&str, &str)] = &[
    vector!("hello_request"),
    vector!("hello_response"),
    vector!("auth_request"),
    vector!("send_request"),
    vector!("send_response"),
    vector!("pull_request"),
    vector!("pull_response"),
    vector!("error_response"),
    vector!("error_frame_too_large"),
    vector!("push"),
    vector!("resync"),
    vector!("resync_all"),
    vector!("join_request"),
    vector!("batch_ack_request"),
    vector!("batch_ack_response"),
    vector!("sync_request"),
    vector!("sync_response"),
    vector!("stats_response"),
    vector!("subscribe_request"),
    vector!("ping_request"),
    vector!("pong_response"),
    vector!("members_request"),
    vector!("members_response"),
    vector!("group_info_request"),
    vector!("group_info_response"),
    vector!("error_not_member"),
    vector!("error_not_leader"),
    vector!("info_request"),
    vector!("cluster_request"),
    vector!("cluster_response"),
    vector!("cluster_map_request"),
    vector!("cluster_map_response"),
    vector!("error_wrong_set"),
    vector!("cluster_change_request"),
    vector!("cluster_change_response"),
    vector!("error_membership_refused"),
    vector!("error_key_reused"),
    vector!("info_response"),
    vector!("slowlog_request"),
    vector!("slowlog_response"),
    vector!("readers_request"),
    vector!("readers_response"),
    vector!("subscribe_receipts_request"),
    vector!("subscribe_receipts_response"),
    vector!("receipt"),
    vector!("receipt_counts"),
    vector!("backup_request"),
    vector!("backup_chunk"),
    vector!("backup_response"),
    vector!("set_retention_request"),
    vector!("set_retention_response"),
    vector!("clear_history_request"),
    vector!("clear_history_response"),
    vector!("recall_request"),
    vector!("recall_response"),
    vector!("edit_request"),
    vector!("edit_response"),
    vector!("pull_response_v2"),
    vector!("pull_response_v1"),
    vector!("history_latest_request"),
    vector!("history_latest_response"),
];

fn vector_bytes(name: &str) -> Vec<u8> {
    let (_, text) = VECTORS
        .iter()
        .find(|(n, _)| *n == name)
        .expect("vector listed");
    parse_hex(text)
}

/// The documented values of each vector (the comments in its file).
fn check_vector(name: &str, r: &[Vec<u8>], verify: impl FnOnce(Expected<'_>)) {
    let e = match name {
        "hello_request" => Expected::Req(
            1,
            Request::Hello {
                min_version: 1,
                max_version: 1,
                client_name: "gw-1",
            },
        ),
        "hello_response" => Expected::Resp(
            1,
            Response::Hello(HelloResponse {
                version: 1,
                auth_required: true,
                frame_bytes_max: 4_194_304,
                payload_bytes_max: 1_048_576,
                requests_in_flight_max: 256,
                server_name: "tidemark/0.2",
            }),
        ),
        "auth_request" => Expected::Req(2, Request::Auth { token: b"s3cret" }),
        "send_request" => Expected::Req(
            3,
            Request::Send {
                group: 7,
                sender: 42,
                client_msg_id: 9,
                payload: b"hello",
            },
        ),
        "send_response" => Expected::Resp(
            3,
            Response::Send {
                msg_id: 1001,
                timestamp_ms: 1_700_000_000_123,
                duplicate: false,
            },
        ),
        "pull_request" => Expected::Req(
            4,
            Request::Pull {
                group: 7,
                user: 5,
                ack_up_to: 1000,
                max_count: 200,
                max_bytes: 65536,
                wait_ms: 30_000,
            },
        ),
        "pull_response" => Expected::Resp(
            4,
            Response::Pull {
                cursor: 1000,
                head: 1002,
                has_more: false,
                records: records(&r[0]),
            },
        ),
        "error_response" => Expected::Resp(
            5,
            Response::Error(ErrorResponse {
                code: ErrorCode::BelowRetentionFloor,
                detail: Some(500),
                message: "msg_id 120 is below the retention floor 500",
            }),
        ),
        "error_frame_too_large" => Expected::Resp(
            0,
            Response::Error(ErrorResponse {
                code: ErrorCode::FrameTooLarge,
                detail: Some(4_194_304),
                message: "frame length 4194305 exceeds the limit of 4194304",
            }),
        ),
        "push" => Expected::Resp(
            0,
            Response::Push {
                group: 7,
                records: records(&r[1]),
            },
        ),
        "resync" => Expected::Resp(0, Response::Resync(ResyncScope::Group(7))),
        "resync_all" => Expected::Resp(0, Response::Resync(ResyncScope::All)),
        "join_request" => Expected::Req(
            6,
            Request::Join {
                group: 7,
                user: 5,
                start: JoinStart::At(1000),
            },
        ),
        "batch_ack_request" => Expected::Req(
            7,
            Request::BatchAck {
                user: 5,
                items: vec![
                    AckItem {
                        group: 7,
                        msg_id: 1002,
                    },
                    AckItem {
                        group: 8,
                        msg_id: 30,
                    },
                ],
            },
        ),
        "batch_ack_response" => Expected::Resp(
            7,
            Response::BatchAck(vec![
                BatchAckResult {
                    group: 7,
                    error: None,
                    cursor: 1002,
                },
                BatchAckResult {
                    group: 8,
                    error: Some(ErrorCode::NotMember),
                    cursor: 0,
                },
            ]),
        ),
        "sync_request" => Expected::Req(
            8,
            Request::Sync {
                user: 5,
                per_group_max: 1,
                total_max_bytes: 65536,
                continuation: 0,
            },
        ),
        "sync_response" => Expected::Resp(
            8,
            Response::Sync {
                next_continuation: 0,
                groups: vec![
                    SyncGroup {
                        entry: UnreadEntry {
                            group: 7,
                            head: 1003,
                            cursor: 1002,
                            unread: 1,
                        },
                        records: records(&r[1]),
                    },
                    SyncGroup {
                        entry: UnreadEntry {
                            group: 9,
                            head: 50,
                            cursor: 40,
                            unread: 10,
                        },
                        records: records(&r[2]),
                    },
                ],
            },
        ),
        "stats_response" => Expected::Resp(
            9,
            Response::Stats(vec![
                Stat {
                    name: "engine.appends",
                    value: 1_000_000,
                },
                Stat {
                    name: "net.connections",
                    value: 16,
                },
            ]),
        ),
        "subscribe_request" => {
            Expected::Req(10, Request::Subscribe(Subscription::Groups(vec![7, 9])))
        }
        "ping_request" => Expected::Req(11, Request::Ping),
        "pong_response" => Expected::Resp(11, Response::Pong),
        "members_request" => Expected::Req(
            12,
            Request::Members {
                group: 7,
                after_user: 5,
                max_count: 2,
            },
        ),
        "members_response" => Expected::Resp(
            12,
            Response::Members {
                has_more: true,
                members: vec![
                    MemberEntry {
                        user: 9,
                        cursor: 1002,
                    },
                    MemberEntry {
                        user: 12,
                        cursor: 1000,
                    },
                ],
            },
        ),
        "group_info_request" => Expected::Req(13, Request::GroupInfo { group: 7 }),
        "set_retention_request" => Expected::Req(
            16,
            Request::SetRetention {
                group: 7,
                by_cursor: true,
                max_age_ms: 604_800_000,
                max_bytes: 1 << 30,
            },
        ),
        "set_retention_response" => Expected::Resp(16, Response::SetRetention),
        "clear_history_request" => Expected::Req(
            17,
            Request::ClearHistory {
                group: 7,
                user: 5,
                up_to: 1000,
            },
        ),
        "clear_history_response" => Expected::Resp(
            17,
            Response::ClearHistory {
                join_point: 1001,
                cursor: 1002,
            },
        ),
        "group_info_response" => Expected::Resp(
            13,
            Response::GroupInfo(GroupInfo {
                head: 1003,
                floor: 501,
                member_count: 3,
                retention: RetentionPolicy {
                    by_cursor: true,
                    max_age_ms: 604_800_000,
                    max_bytes: 1 << 30,
                },
            }),
        ),
        "error_not_member" => Expected::Resp(
            3,
            Response::Error(ErrorResponse {
                code: ErrorCode::NotMember,
                detail: None,
                message: "SEND refused: sender 42 is not a member of group 7",
            }),
        ),
        "error_not_leader" => Expected::Resp(
            4,
            Response::Error(ErrorResponse {
                code: ErrorCode::NotLeader,
                detail: Some(2),
                message: "not the leader: node 2 leads, its clients' address is 127.0.0.1:7002",
            }),
        ),
        "cluster_request" => Expected::Req(16, Request::Cluster),
        "cluster_response" => Expected::Resp(
            16,
            Response::Cluster(ClusterMap {
                node_id: 3,
                leader_id: 2,
                members: vec![
                    ClusterMember {
                        node_id: 1,
                        client_addr: "127.0.0.1:7001",
                    },
                    ClusterMember {
                        node_id: 2,
                        client_addr: "127.0.0.1:7002",
                    },
                    ClusterMember {
                        node_id: 3,
                        client_addr: "127.0.0.1:7003",
                    },
                ],
            }),
        ),
        "cluster_change_request" => Expected::Req(
            30,
            Request::ClusterChange(crate::MemberChange::Add {
                node_id: 4,
                cluster_addr: "127.0.0.1:7104",
                client_addr: "127.0.0.1:7004",
            }),
        ),
        "cluster_change_response" => Expected::Resp(
            30,
            Response::ClusterChange(ClusterMap {
                node_id: 1,
                leader_id: 1,
                members: vec![
                    ClusterMember {
                        node_id: 1,
                        client_addr: "127.0.0.1:7001",
                    },
                    ClusterMember {
                        node_id: 2,
                        client_addr: "127.0.0.1:7002",
                    },
                    ClusterMember {
                        node_id: 3,
                        client_addr: "127.0.0.1:7003",
                    },
                    ClusterMember {
                        node_id: 4,
                        client_addr: "127.0.0.1:7004",
                    },
                ],
            }),
        ),
        "error_membership_refused" => Expected::Resp(
            31,
            Response::Error(ErrorResponse {
                code: ErrorCode::MembershipRefused,
                detail: Some(3),
                message: "node 9 is not a member",
            }),
        ),
        "error_key_reused" => Expected::Resp(
            19,
            Response::Error(ErrorResponse {
                code: ErrorCode::KeyReused,
                detail: Some(1001),
                message: "the key (sender 42, client_msg_id 9) names message 1001 of group 7, \
                          a request of another kind or target; a new request needs a new \
                          client_msg_id",
            }),
        ),
        "cluster_map_request" => Expected::Req(22, Request::ClusterMap),
        "cluster_map_response" => {
            let member = |node_id, client_addr| ClusterMember {
                node_id,
                client_addr,
            };
            Expected::Resp(
                22,
                Response::ClusterMap(ShardMap {
                    epoch: 3,
                    node_id: 4,
                    set_id: 2,
                    shard_count: SHARD_COUNT,
                    sets: vec![
                        ReplicaSetEntry {
                            set_id: 1,
                            leader_id: 0,
                            members: vec![
                                member(1, "127.0.0.1:7001"),
                                member(2, "127.0.0.1:7002"),
                                member(3, "127.0.0.1:7003"),
                            ],
                        },
                        ReplicaSetEntry {
                            set_id: 2,
                            leader_id: 4,
                            members: vec![member(4, "127.0.0.1:7004")],
                        },
                    ],
                    ranges: vec![
                        ShardRange {
                            first: 0,
                            last: 511,
                            set_id: 1,
                        },
                        ShardRange {
                            first: 512,
                            last: 1023,
                            set_id: 2,
                        },
                    ],
                }),
            )
        }
        "error_wrong_set" => Expected::Resp(
            23,
            Response::Error(ErrorResponse {
                code: ErrorCode::WrongSet,
                detail: Some(2),
                message: "wrong set: group 1 (shard 632) is held by set 2; its members' client \
                          addresses are 127.0.0.1:7004",
            }),
        ),
        "info_request" => Expected::Req(14, Request::Info),
        "info_response" => Expected::Resp(
            14,
            Response::Info(vec![
                InfoItem {
                    name: "server.version",
                    value: "0.1.0",
                },
                InfoItem {
                    name: "server.fsync_policy",
                    value: "always",
                },
            ]),
        ),
        "slowlog_request" => Expected::Req(
            15,
            Request::SlowLog {
                reset: false,
                max_count: 10,
            },
        ),
        "slowlog_response" => Expected::Resp(
            15,
            Response::SlowLog(SlowLog {
                threshold_us: 10_000,
                entries_max: 128,
                held: 1,
                recorded: 3,
                entries: vec![SlowLogEntry {
                    id: 3,
                    unix_ms: 1_700_000_000_123,
                    duration_ns: 12_500_000,
                    opcode: Opcode::Send.request_byte(),
                    client: "127.0.0.1:50412",
                    args: "group=7 sender=42 client_msg_id=9 payload_bytes=5",
                }],
            }),
        ),
        "readers_request" => Expected::Req(
            14,
            Request::Readers {
                group: 7,
                msg_id: 1002,
                after_user: 0,
                max_count: 100,
            },
        ),
        "readers_response" => Expected::Resp(
            14,
            Response::Readers {
                next_after_user: 12,
                readers: vec![
                    MemberEntry {
                        user: 9,
                        cursor: 1002,
                    },
                    MemberEntry {
                        user: 12,
                        cursor: 1003,
                    },
                ],
            },
        ),
        "subscribe_receipts_request" => Expected::Req(
            15,
            Request::SubscribeReceipts {
                sender: 42,
                groups: vec![7],
            },
        ),
        "subscribe_receipts_response" => Expected::Resp(15, Response::SubscribeReceipts),
        "receipt" => Expected::Resp(
            0,
            Response::Receipt {
                group: 7,
                receipts: vec![
                    MemberEntry {
                        user: 5,
                        cursor: 1003,
                    },
                    MemberEntry {
                        user: 9,
                        cursor: 1002,
                    },
                ],
            },
        ),
        "receipt_counts" => Expected::Resp(
            0,
            Response::ReceiptCounts {
                group: 7,
                sender: 42,
                counts: vec![
                    ReceiptCount {
                        msg_id: 1001,
                        count: 2,
                    },
                    ReceiptCount {
                        msg_id: 1003,
                        count: 1,
                    },
                ],
            },
        ),
        "backup_request" => Expected::Req(14, Request::Backup),
        "backup_chunk" => Expected::Resp(
            14,
            Response::BackupChunk(BackupChunk {
                name: "FORMAT",
                file_len: 32,
                offset: 0,
                crc32: 0x8005_82f7,
                data: b"TDMKFMT\0",
            }),
        ),
        "backup_response" => Expected::Resp(
            14,
            Response::Backup(BackupEnd {
                checkpoint_seq: 3,
                journal_seq: 5,
                journal_len: 4144,
                pause_us: 7,
                files: 6,
                bytes: 20480,
            }),
        ),
        "recall_request" => Expected::Req(
            18,
            Request::Recall {
                group: 7,
                sender: 42,
                client_msg_id: 10,
                target: 1001,
            },
        ),
        "recall_response" => Expected::Resp(
            18,
            Response::Recall {
                msg_id: 1004,
                timestamp_ms: 1_700_000_000_999,
                duplicate: false,
            },
        ),
        "edit_request" => Expected::Req(
            19,
            Request::Edit {
                group: 7,
                sender: 43,
                client_msg_id: 2,
                target: 1002,
                payload: b"world?",
            },
        ),
        "edit_response" => Expected::Resp(
            19,
            Response::Edit {
                msg_id: 1003,
                timestamp_ms: 1_700_000_000_789,
                duplicate: false,
            },
        ),
        "pull_response_v2" | "pull_response_v1" => Expected::Resp(
            20,
            Response::Pull {
                cursor: 1000,
                head: 1004,
                has_more: false,
                records: records(&r[if name == "pull_response_v2" { 3 } else { 4 }]),
            },
        ),
        "history_latest_request" => Expected::Req(
            21,
            Request::HistoryLatest {
                group: 7,
                user: 5,
                before_msg_id: 0,
                max_count: 10,
            },
        ),
        "history_latest_response" => Expected::Resp(
            21,
            Response::HistoryLatest {
                has_more: false,
                next_before: 1001,
                records: records(&r[5]),
            },
        ),
        other => panic!("vector {other} has no documented values"),
    };
    verify(e)
}

/// The records the vectors carry, built by the engine.
fn vector_records() -> Vec<Vec<u8>> {
    let mut pull = rec(1001, 1_700_000_000_123, 42, 9, b"hello");
    pull.extend(rec(1002, 1_700_000_000_456, 43, 1, b"world!"));
    // pull_response.hex's group after an EDIT of 1002 and a RECALL of
    // 1001: as a version 2 session sees it (1001 recalled, the changes as
    // stored), and as a version 1 session does (placeholders, 7).
    let edit = [&1002u64.to_le_bytes()[..], b"world?"].concat();
    let recall = 1001u64.to_le_bytes();
    let v2 = [
        rec_kind(1001, 1_700_000_000_123, 42, 9, 0, FLAG_RECALLED, b""),
        rec(1002, 1_700_000_000_456, 43, 1, b"world!"),
        rec_kind(1003, 1_700_000_000_789, 43, 2, KIND_EDIT, 0, &edit),
        rec_kind(1004, 1_700_000_000_999, 42, 10, KIND_RECALL, 0, &recall),
    ]
    .concat();
    let v1 = [
        rec(1001, 1_700_000_000_123, 42, 9, b""),
        rec(1002, 1_700_000_000_456, 43, 1, b"world!"),
        rec(1003, 1_700_000_000_789, 43, 2, b""),
        rec(1004, 1_700_000_000_999, 42, 10, b""),
    ]
    .concat();
    // The same group as it reads now, newest first (HISTORY_LATEST).
    let latest = [
        rec_kind(1002, 1_700_000_000_456, 43, 1, 0, FLAG_EDITED, b"world?"),
        rec_kind(1001, 1_700_000_000_123, 42, 9, 0, FLAG_RECALLED, b""),
    ]
    .concat();
    vec![
        pull,
        rec(1003, 1_700_000_000_789, 42, 10, b"hi"),
        rec(41, 1_699_999_999_000, 77, 3, b"yo"),
        v2,
        v1,
        latest,
    ]
}

/// A record of any kind and flags (the engine's encoder writes flags 0;
/// a recalled message's presentation sets bit 0).
fn rec_kind(
    msg_id: u64,
    timestamp_ms: u64,
    sender_id: u64,
    client_msg_id: u64,
    kind: u8,
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut out = Vec::new();
    record::encode_kind_into(
        &NewRecord {
            msg_id,
            timestamp_ms,
            sender_id,
            client_msg_id,
            payload,
        },
        kind,
        &mut out,
    );
    out[41] = flags;
    let crc = crc32fast::hash(&out[8..]);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    out
}

#[test]
fn vectors_decode_to_documented_values_and_reencode_exactly() {
    let recs = vector_records();
    for (name, text) in VECTORS {
        let bytes = parse_hex(text);
        let frame = Frame::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        check_vector(name, &recs, |expected| match expected {
            Expected::Req(id, req) => {
                assert_eq!(frame.header.request_id, id, "{name}");
                assert_eq!(decode_request(&frame).as_ref(), Ok(&req), "{name}");
                let mut out = Vec::new();
                encode_request_in(frame.header.version, id, &req, &mut out).unwrap();
                assert_eq!(out, bytes, "{name}: encoding differs from the vector");
            }
            Expected::Resp(id, resp) => {
                assert_eq!(frame.header.request_id, id, "{name}");
                assert_eq!(decode_response(&frame).as_ref(), Ok(&resp), "{name}");
                let mut out = Vec::new();
                encode_response_in(frame.header.version, id, &resp, &mut out).unwrap();
                assert_eq!(out, bytes, "{name}: encoding differs from the vector");
            }
        });
    }
}

#[test]
fn vector_records_verify_end_to_end() {
    let bytes = vector_bytes("pull_response");
    let frame = Frame::parse(&bytes).unwrap();
    let Response::Pull { records, .. } = decode_response(&frame).unwrap() else {
        panic!("not a PULL response");
    };
    let got: Vec<_> = records.iter(true).collect::<Result<_, _>>().unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].msg_id(), got[0].payload()), (1001, &b"hello"[..]));
    assert_eq!(
        (got[1].msg_id(), got[1].timestamp_ms(), got[1].sender_id()),
        (1002, 1_700_000_000_456, 43)
    );
    assert_eq!(got[1].client_msg_id(), 1);
    for r in &got {
        let h = record::decode_verified(r.bytes(), 1 << 20).unwrap();
        assert_eq!(h.msg_id, r.msg_id());
    }
}

#[test]
fn head_encoding_plus_record_slices_equals_the_whole_frame() {
    let recs = vector_records();
    for name in ["pull_response", "push", "sync_response"] {
        let bytes = vector_bytes(name);
        check_vector(name, &recs, |e| {
            let Expected::Resp(id, resp) = e else {
                panic!("{name} is a response")
            };
            let len = |r: &Records<'_>| RecordsLen {
                count: r.count,
                bytes: r.bytes.len() as u32,
            };
            let (head_resp, slices): (Response<'_, RecordsLen>, Vec<&[u8]>) = match &resp {
                Response::Pull {
                    cursor,
                    head,
                    has_more,
                    records,
                } => (
                    Response::Pull {
                        cursor: *cursor,
                        head: *head,
                        has_more: *has_more,
                        records: len(records),
                    },
                    vec![records.bytes],
                ),
                Response::Push { group, records } => (
                    Response::Push {
                        group: *group,
                        records: len(records),
                    },
                    vec![records.bytes],
                ),
                Response::Sync {
                    next_continuation,
                    groups,
                } => (
                    Response::Sync {
                        next_continuation: *next_continuation,
                        groups: groups
                            .iter()
                            .map(|g| SyncGroup {
                                entry: g.entry,
                                records: len(&g.records),
                            })
                            .collect(),
                    },
                    groups.iter().map(|g| g.records.bytes).collect(),
                ),
                _ => unreachable!(),
            };
            let mut out = encode_response_head(id, &head_resp).unwrap();
            // The head holds no record bytes; the caller writes them (writev).
            assert_eq!(
                out.len() + slices.iter().map(|s| s.len()).sum::<usize>(),
                bytes.len()
            );
            for s in slices {
                out.extend_from_slice(s);
            }
            assert_eq!(out, bytes, "{name}");
            // The all-in-one encoder's head agrees too.
            let full_head = encode_response_head(id, &resp).unwrap();
            assert_eq!(full_head, bytes[..full_head.len()], "{name}");
        });
    }
}

/// Decodes `frame` as whatever its opcode says; if it decodes, re-encoding
/// must give back exactly `bytes` (the encoding is canonical).
fn decode_any_and_check_canonical(bytes: &[u8]) -> bool {
    let Ok(frame) = Frame::parse(bytes) else {
        return false;
    };
    let mut out = Vec::new();
    match FrameKind::from_byte(frame.header.opcode) {
        Some(FrameKind::Request(_)) => match decode_request(&frame) {
            Ok(req) => {
                let v = frame.header.version;
                encode_request_in(v, frame.header.request_id, &req, &mut out).unwrap();
            }
            Err(_) => return false,
        },
        _ => match decode_response(&frame) {
            Ok(resp) => {
                let v = frame.header.version;
                encode_response_in(v, frame.header.request_id, &resp, &mut out).unwrap();
            }
            Err(_) => return false,
        },
    }
    assert_eq!(out, bytes, "decoded frame does not re-encode canonically");
    true
}

/// The same frame with its body cut to `body_len` and the length prefix
/// fixed up, so the body decoder (not the framing) sees the truncation.
fn with_body_truncated(bytes: &[u8], body_len: usize) -> Vec<u8> {
    let mut v = bytes[..FRAME_HEADER_BYTES + body_len].to_vec();
    let frame_len = (v.len() - 4) as u32;
    v[..4].copy_from_slice(&frame_len.to_le_bytes());
    v
}

#[test]
fn every_truncation_of_every_vector_is_a_clean_error() {
    for (name, text) in VECTORS {
        let bytes = parse_hex(text);
        for n in 0..bytes.len() {
            assert!(Frame::parse(&bytes[..n]).is_err(), "{name} cut at {n}");
            // A stream decoder holding a prefix waits for more.
            let mut d = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
            d.push(&bytes[..n]);
            assert_eq!(d.next_frame(), Ok(None), "{name} cut at {n}");
        }
        for body_len in 0..bytes.len() - FRAME_HEADER_BYTES {
            let cut = with_body_truncated(&bytes, body_len);
            assert!(
                !decode_any_and_check_canonical(&cut),
                "{name} with body cut to {body_len} bytes decoded"
            );
        }
    }
}

/// xorshift64*: a tiny deterministic PRNG for the garbage tests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Iterations of the garbage loops; `TIDEMARK_FUZZ_ITERS` raises it.
fn iterations() -> usize {
    std::env::var("TIDEMARK_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

#[test]
fn mutated_vectors_never_panic_and_stay_canonical() {
    let mut rng = Rng(0x7469_6465_6d61_726b);
    let vectors: Vec<Vec<u8>> = VECTORS.iter().map(|(_, t)| parse_hex(t)).collect();
    let mut decoded = 0;
    for _ in 0..iterations() {
        let mut v = vectors[rng.below(vectors.len())].clone();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(v.len());
            match rng.below(3) {
                0 => v[i] ^= 1 << rng.below(8),
                1 => v[i] = rng.next() as u8,
                _ => {
                    // Small values in length and count fields are the
                    // interesting ones.
                    v[i] = rng.below(4) as u8;
                }
            }
        }
        // Keep the prefix consistent half of the time so bodies get decoded.
        if rng.below(2) == 0 {
            let frame_len = (v.len() - 4) as u32;
            v[..4].copy_from_slice(&frame_len.to_le_bytes());
        }
        if decode_any_and_check_canonical(&v) {
            decoded += 1;
        }
    }
    // Many mutations hit fields whose every value is valid.
    assert!(
        decoded > iterations() / 10,
        "only {decoded} mutants decoded"
    );
}

#[test]
fn random_garbage_through_the_stream_decoder_never_panics() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..iterations() / 10 {
        let max = 16 + rng.below(256) as u32;
        let mut d = FrameDecoder::new(max);
        let mut garbage = vec![0u8; rng.below(2048)];
        for b in &mut garbage {
            *b = rng.next() as u8;
        }
        // Plausible prefixes now and then so frames complete.
        if garbage.len() >= 4 && rng.below(2) == 0 {
            let len = 12 + rng.below(64) as u32;
            garbage[..4].copy_from_slice(&len.to_le_bytes());
        }
        let mut rest = &garbage[..];
        loop {
            let chunk = rest.len().min(1 + rng.below(97));
            let n = d.push(&rest[..chunk]);
            rest = &rest[n..];
            assert!(d.buffered() <= d.buffer_bytes_max());
            let mut progressed = n > 0;
            loop {
                match d.next_frame() {
                    Ok(Some(f)) => {
                        progressed = true;
                        let _ = decode_request(&f);
                        let _ = decode_response(&f);
                    }
                    Ok(None) => break,
                    Err(_) => {
                        assert_eq!(d.push(&[0; 8]), 0, "a failed decoder accepts nothing");
                        progressed = false;
                        break;
                    }
                }
            }
            if rest.is_empty() || !progressed {
                break;
            }
        }
    }
}

#[test]
fn a_stream_of_all_vectors_splits_into_them_whatever_the_chunking() {
    let vectors: Vec<Vec<u8>> = VECTORS.iter().map(|(_, t)| parse_hex(t)).collect();
    let stream: Vec<u8> = vectors.concat();
    let mut rng = Rng(42);
    for _ in 0..50 {
        let mut d = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
        let mut got = Vec::new();
        let mut rest = &stream[..];
        while !rest.is_empty() {
            let chunk = rest.len().min(1 + rng.below(60));
            let n = d.push(&rest[..chunk]);
            rest = &rest[n..];
            while let Some(f) = d.next_frame().unwrap() {
                let mut whole = Vec::new();
                whole.extend_from_slice(&f.header.frame_len.to_le_bytes());
                whole.push(f.header.version);
                whole.push(f.header.opcode);
                whole.extend_from_slice(&f.header.flags.to_le_bytes());
                whole.extend_from_slice(&f.header.request_id.to_le_bytes());
                whole.extend_from_slice(f.body);
                got.push(whole);
            }
        }
        assert_eq!(got, vectors);
    }
}

#[test]
fn a_huge_count_with_few_bytes_left_is_an_error_not_an_allocation() {
    // BATCH_ACK with a count of u32::MAX and 10 bytes after it.
    let mut body = Vec::new();
    body.extend(5u64.to_le_bytes());
    body.extend(u32::MAX.to_le_bytes());
    body.extend([0u8; 10]);
    let mut bytes = Vec::new();
    bytes.extend(((12 + body.len()) as u32).to_le_bytes());
    bytes.extend([1, Opcode::BatchAck.request_byte(), 0, 0]);
    bytes.extend(1u64.to_le_bytes());
    bytes.extend(&body);
    let frame = Frame::parse(&bytes).unwrap();
    assert_eq!(
        decode_request(&frame),
        Err(DecodeError::CountTooLarge {
            field: "items",
            offset: 24,
            count: u32::MAX,
            elem_bytes_min: 16,
            remaining: 10,
        })
    );
    // A payload length beyond the frame.
    let mut send = vector_bytes("send_request");
    send[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
    let frame = Frame::parse(&send).unwrap();
    assert!(matches!(
        decode_request(&frame),
        Err(DecodeError::CountTooLarge {
            field: "payload",
            offset: 40,
            ..
        })
    ));
}

#[test]
fn header_violations_get_typed_errors_and_wire_codes() {
    let base = vector_bytes("ping_request");
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut v = base.clone();
        f(&mut v);
        v
    };
    fn decode(v: &[u8]) -> Result<Request<'_>, DecodeError> {
        decode_request(&Frame::parse(v).unwrap())
    }

    let e = decode(&with(&|v| v[4] = 3)).unwrap_err();
    assert_eq!(e, DecodeError::UnsupportedVersion { version: 3 });
    assert_eq!(e.error_code(), ErrorCode::UnsupportedVersion);
    assert!(e.error_code().is_fatal());

    let e = decode(&with(&|v| v[5] = 0x3F)).unwrap_err();
    assert!(matches!(e, DecodeError::UnknownOpcode { opcode: 0x3F, .. }));
    assert_eq!(e.error_code(), ErrorCode::BadFrame);
    // A response opcode is not a request.
    let e = decode(&with(&|v| v[5] = 0x83)).unwrap_err();
    assert!(matches!(e, DecodeError::UnknownOpcode { .. }));

    let e = decode(&with(&|v| v[6] = 1)).unwrap_err();
    assert_eq!(e, DecodeError::UnknownFlags { flags: 1 });

    let e = decode(&with(&|v| v[8..16].fill(0))).unwrap_err();
    assert!(matches!(e, DecodeError::BadRequestId { request_id: 0, .. }));

    // Trailing bytes after a complete body.
    let mut v = base.clone();
    v.push(0);
    v[..4].copy_from_slice(&13u32.to_le_bytes());
    assert_eq!(
        decode(&v),
        Err(DecodeError::TrailingBytes {
            offset: 16,
            count: 1
        })
    );

    // PUSH with a request id, a non-ERROR response without one.
    let mut push = vector_bytes("push");
    push[8] = 1;
    assert!(matches!(
        decode_response(&Frame::parse(&push).unwrap()),
        Err(DecodeError::BadRequestId { .. })
    ));
    let mut pong = vector_bytes("pong_response");
    pong[8..16].fill(0);
    assert!(matches!(
        decode_response(&Frame::parse(&pong).unwrap()),
        Err(DecodeError::BadRequestId { .. })
    ));
}

#[test]
fn invalid_values_are_rejected_with_their_offset() {
    // A bool of 2: SEND response's duplicate at offset 32.
    let mut v = vector_bytes("send_response");
    v[32] = 2;
    assert_eq!(
        decode_response(&Frame::parse(&v).unwrap()),
        Err(DecodeError::InvalidValue {
            field: "duplicate",
            offset: 32,
            value: 2
        })
    );
    // JOIN start tag 3, and HEAD with a nonzero start_msg_id.
    let mut v = vector_bytes("join_request");
    v[32] = 3;
    assert!(matches!(
        decode_request(&Frame::parse(&v).unwrap()),
        Err(DecodeError::InvalidValue {
            field: "start",
            offset: 32,
            ..
        })
    ));
    v[32] = 0;
    assert!(matches!(
        decode_request(&Frame::parse(&v).unwrap()),
        Err(DecodeError::InvalidValue { offset: 33, .. })
    ));
    // Group and user ids are nonzero: SEND to group 0.
    let mut v = vector_bytes("send_request");
    v[16..24].fill(0);
    assert_eq!(
        decode_request(&Frame::parse(&v).unwrap()),
        Err(DecodeError::InvalidValue {
            field: "group",
            offset: 16,
            value: 0
        })
    );
    // An ERROR with code 0.
    let mut v = vector_bytes("error_response");
    v[16..18].fill(0);
    assert!(matches!(
        decode_response(&Frame::parse(&v).unwrap()),
        Err(DecodeError::InvalidValue { field: "code", .. })
    ));
    // A string that is not UTF-8: HELLO client_name at offset 18 (+4).
    let mut v = vector_bytes("hello_request");
    v[22] = 0xff;
    assert_eq!(
        decode_request(&Frame::parse(&v).unwrap()),
        Err(DecodeError::InvalidUtf8 {
            field: "client_name",
            offset: 22
        })
    );
    // A record_len below 44 inside a PULL response.
    let mut v = vector_bytes("pull_response");
    v[41..45].copy_from_slice(&43u32.to_le_bytes());
    assert!(matches!(
        decode_response(&Frame::parse(&v).unwrap()),
        Err(DecodeError::BadRecords { offset: 41, .. })
    ));
    // A record count that does not match the records.
    let mut v = vector_bytes("pull_response");
    v[33] = 3;
    assert!(matches!(
        decode_response(&Frame::parse(&v).unwrap()),
        Err(DecodeError::BadRecords { .. })
    ));
    // An unknown error code decodes (newer server) and round-trips.
    let mut v = vector_bytes("error_response");
    v[16..18].copy_from_slice(&999u16.to_le_bytes());
    let Ok(Response::Error(e)) = decode_response(&Frame::parse(&v).unwrap()) else {
        panic!("unknown codes decode");
    };
    assert_eq!(e.code, ErrorCode::Unknown(999));
    assert!(decode_any_and_check_canonical(&v));
}

#[test]
fn encoders_refuse_bad_request_ids() {
    let mut out = Vec::new();
    assert!(encode_request(0, &Request::Ping, &mut out).is_err());
    assert!(encode_response(0, &Response::Pong, &mut out).is_err());
    assert!(encode_response(1, &Response::Resync(ResyncScope::All), &mut out).is_err());
    assert!(out.is_empty(), "a failed encode leaves nothing behind");
    let err = Response::Error(ErrorResponse {
        code: ErrorCode::ShuttingDown,
        detail: None,
        message: "",
    });
    assert!(encode_response(0, &err, &mut out).is_ok());
}

#[test]
fn every_request_and_response_round_trips() {
    let r = vector_records();
    let reqs = vec![
        Request::Stats,
        Request::Unsubscribe,
        Request::CreateGroup { group: 1 },
        Request::DeleteGroup { group: u64::MAX },
        Request::Join {
            group: 1,
            user: 2,
            start: JoinStart::Head,
        },
        Request::Join {
            group: 1,
            user: 2,
            start: JoinStart::Earliest,
        },
        Request::Leave { group: 1, user: 2 },
        Request::Ack {
            group: 1,
            user: 2,
            msg_id: 3,
        },
        Request::BatchAck {
            user: 1,
            items: vec![],
        },
        Request::Unread { user: 9 },
        Request::History {
            group: 1,
            user: 2,
            before_msg_id: 0,
            max_count: 50,
        },
        Request::ReadCount {
            group: 1,
            msg_id: 5,
        },
        Request::Subscribe(Subscription::User(77)),
        Request::Subscribe(Subscription::Groups(vec![])),
        Request::Members {
            group: 1,
            after_user: 0,
            max_count: u32::MAX,
        },
        Request::GroupInfo { group: u64::MAX },
        Request::Info,
        Request::SlowLog {
            reset: true,
            max_count: u32::MAX,
        },
        Request::SetRetention {
            group: 1,
            by_cursor: false,
            max_age_ms: u64::MAX,
            max_bytes: 0,
        },
        Request::ClearHistory {
            group: 1,
            user: 2,
            up_to: u64::MAX,
        },
        Request::Readers {
            group: 1,
            msg_id: 0,
            after_user: u64::MAX,
            max_count: 0,
        },
        Request::SubscribeReceipts {
            sender: 1,
            groups: vec![],
        },
    ];
    for (i, req) in reqs.iter().enumerate() {
        let mut out = Vec::new();
        encode_request(i as u64 + 1, req, &mut out).unwrap();
        let frame = Frame::parse(&out).unwrap();
        assert_eq!(frame.header.request_id, i as u64 + 1);
        assert_eq!(&decode_request(&frame).unwrap(), req);
    }
    let resps: Vec<Response<'_>> = vec![
        Response::Auth,
        Response::Info(vec![]),
        Response::SlowLog(SlowLog {
            threshold_us: 0,
            entries_max: 0,
            held: 0,
            recorded: u64::MAX,
            entries: vec![],
        }),
        Response::CreateGroup,
        Response::DeleteGroup,
        Response::Join { cursor: 1, head: 2 },
        Response::Leave,
        Response::SetRetention,
        Response::ClearHistory {
            join_point: 1,
            cursor: 0,
        },
        Response::Ack { cursor: 5 },
        Response::Unread(vec![UnreadEntry {
            group: 1,
            head: 10,
            cursor: 4,
            unread: 6,
        }]),
        Response::History {
            has_more: true,
            records: records(&r[0]),
        },
        Response::History {
            has_more: false,
            records: Records::EMPTY,
        },
        Response::ReadCount { count: 3 },
        Response::Members {
            has_more: false,
            members: vec![],
        },
        Response::GroupInfo(GroupInfo {
            head: 0,
            floor: 1,
            member_count: 0,
            retention: RetentionPolicy::default(),
        }),
        Response::Readers {
            next_after_user: 0,
            readers: vec![],
        },
        Response::Subscribe,
        Response::Unsubscribe,
        Response::SubscribeReceipts,
        Response::Error(ErrorResponse {
            code: ErrorCode::Internal,
            detail: None,
            message: "boom",
        }),
    ];
    for resp in &resps {
        let mut out = Vec::new();
        encode_response(3, resp, &mut out).unwrap();
        assert_eq!(
            &decode_response(&Frame::parse(&out).unwrap()).unwrap(),
            resp
        );
    }
    let mut out = Vec::new();
    encode_response(0, &Response::Resync(ResyncScope::All), &mut out).unwrap();
    assert_eq!(
        decode_response(&Frame::parse(&out).unwrap()).unwrap(),
        Response::Resync(ResyncScope::All)
    );
}

/// A RECEIPT or RECEIPT_COUNTS frame says something or is not sent: an
/// empty list, a zero group or a zero sender is malformed (the decoder's
/// canonical form has no empty receipt), and receipts carry request id 0.
#[test]
fn receipt_frames_are_never_empty_and_carry_request_id_0() {
    for resp in [
        Response::Receipt {
            group: 7,
            receipts: vec![],
        },
        Response::ReceiptCounts {
            group: 7,
            sender: 42,
            counts: vec![],
        },
        Response::Receipt {
            group: 0,
            receipts: vec![MemberEntry { user: 1, cursor: 1 }],
        },
        Response::ReceiptCounts {
            group: 7,
            sender: 0,
            counts: vec![ReceiptCount {
                msg_id: 1,
                count: 1,
            }],
        },
    ] {
        let mut out = Vec::new();
        encode_response(0, &resp, &mut out).unwrap();
        let err = decode_response(&Frame::parse(&out).unwrap()).unwrap_err();
        assert!(
            matches!(err, DecodeError::InvalidValue { .. }),
            "{resp:?}: {err:?}"
        );
        assert!(encode_response(1, &resp, &mut Vec::new()).is_err());
    }
}

#[test]
fn frame_limit_covers_a_largest_record_response() {
    // A PULL response with one record of payload_bytes_max fits exactly in
    // frame_bytes_min_for_payload, and so does SYNC (the largest overhead).
    let payload = vec![7u8; 1000];
    let rec = rec(1, 2, 3, 4, &payload);
    let min = frame_bytes_min_for_payload(payload.len() as u32);
    let mut out = Vec::new();
    encode_response(
        1,
        &Response::Sync {
            next_continuation: 0,
            groups: vec![SyncGroup {
                entry: UnreadEntry {
                    group: 1,
                    head: 1,
                    cursor: 0,
                    unread: 1,
                },
                records: records(&rec),
            }],
        },
        &mut out,
    )
    .unwrap();
    assert_eq!((out.len() - 4) as u64, min);
}

#[test]
fn a_backup_chunk_with_a_wrong_crc_or_past_its_file_is_refused() {
    let good = vector_bytes("backup_chunk");
    let frame = Frame::parse(&good).unwrap();
    assert!(decode_response(&frame).is_ok());
    // A data byte flipped: the CRC no longer matches.
    let mut bad = good.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    let err = decode_response(&Frame::parse(&bad).unwrap()).unwrap_err();
    assert!(
        matches!(err, DecodeError::InvalidValue { offset: 42, .. }),
        "{err:?}"
    );
    // file_len 4: the 8 data bytes end past it.
    let mut bad = good.clone();
    bad[26] = 4;
    let err = decode_response(&Frame::parse(&bad).unwrap()).unwrap_err();
    assert!(
        matches!(err, DecodeError::InvalidValue { offset: 34, .. }),
        "{err:?}"
    );
    // Request id 0 is refused for a chunk, as for any response.
    let mut bad = good;
    bad[8] = 0;
    let err = decode_response(&Frame::parse(&bad).unwrap()).unwrap_err();
    assert!(matches!(err, DecodeError::BadRequestId { .. }), "{err:?}");
}

/// Protocol version 2: which frames and record kinds each
/// version has.
mod version_2 {
    use super::*;

    fn with_version(name: &str, version: u8) -> Vec<u8> {
        let mut v = vector_bytes(name);
        v[4] = version;
        v
    }

    #[test]
    fn recall_and_edit_exist_from_version_2_and_hello_stays_version_1() {
        for name in ["recall_request", "edit_request"] {
            let v1 = with_version(name, 1);
            let e = decode_request(&Frame::parse(&v1).unwrap()).unwrap_err();
            assert!(matches!(e, DecodeError::UnknownOpcode { .. }), "{name}");
            assert_eq!(e.error_code(), ErrorCode::BadFrame);
        }
        let v1 = with_version("recall_response", 1);
        assert!(matches!(
            decode_response(&Frame::parse(&v1).unwrap()),
            Err(DecodeError::UnknownOpcode { .. })
        ));
        let req = Request::Recall {
            group: 7,
            sender: 42,
            client_msg_id: 10,
            target: 1001,
        };
        let mut out = Vec::new();
        assert!(matches!(
            encode_request_in(1, 18, &req, &mut out),
            Err(EncodeError::NotInVersion { .. })
        ));
        // HELLO is a version 1 frame whatever the session speaks.
        let hello = with_version("hello_request", 2);
        assert!(decode_request(&Frame::parse(&hello).unwrap()).is_err());
        let hello = Request::Hello {
            min_version: 1,
            max_version: 2,
            client_name: "x",
        };
        encode_request_in(2, 1, &hello, &mut out).unwrap();
        assert_eq!(out[4], 1);
        // Every other frame of version 1 decodes in version 2 unchanged.
        for (name, _) in VECTORS {
            if name.starts_with("hello") || name.ends_with("_v1") {
                continue;
            }
            let mut v = with_version(name, 2);
            assert!(decode_any_and_check_canonical(&v), "{name} in version 2");
            // And back in version 1, unless it is new in version 2.
            set_version(&mut v, 1);
            let v2_only = ["recall_", "edit_", "pull_response_v2", "history_latest"];
            if !v2_only.iter().any(|p| name.starts_with(p)) {
                assert!(decode_any_and_check_canonical(&v), "{name} in version 1");
            }
        }
    }

    /// The records of pull_response_v2.hex are refused in a version 1
    /// frame; a version 2 frame refuses what its kinds do not allow.
    #[test]
    fn record_kinds_are_checked_per_version() {
        let v2 = vector_bytes("pull_response_v2");
        let as_v1 = with_version("pull_response_v2", 1);
        assert!(matches!(
            decode_response(&Frame::parse(&as_v1).unwrap()),
            Err(DecodeError::BadRecords { .. })
        ));
        let Response::Pull { records, .. } = decode_response(&Frame::parse(&v2).unwrap()).unwrap()
        else {
            panic!("a PULL response")
        };
        let got: Vec<_> = records.iter(true).collect::<Result<_, _>>().unwrap();
        assert!(got[0].is_recalled() && got[0].payload().is_empty());
        assert_eq!(
            (got[2].target(), got[2].edit_payload()),
            (Some(1002), Some(&b"world?"[..]))
        );
        assert_eq!((got[3].kind(), got[3].target()), (KIND_RECALL, Some(1001)));
        let section = |r: Vec<u8>| {
            let n = r.len() as u32;
            let resp = Response::Push {
                group: 7,
                records: Records {
                    count: 1,
                    bytes: &r,
                },
            };
            let mut out = Vec::new();
            encode_response_in(2, 0, &resp, &mut out).unwrap();
            assert_eq!(out.len() as u32, 16 + 16 + n);
            decode_response(&Frame::parse(&out).unwrap()).map(|_| ())
        };
        let target = 5u64.to_le_bytes();
        for (what, r) in [
            (
                "recalled with a payload",
                rec_kind(9, 1, 2, 3, 0, FLAG_RECALLED, b"x"),
            ),
            ("flags 3", rec_kind(9, 1, 2, 3, 0, 3, b"")),
            ("flag bit 2", rec_kind(9, 1, 2, 3, 0, 4, b"")),
            (
                "an edit with a flag",
                rec_kind(9, 1, 2, 3, KIND_EDIT, 2, &target),
            ),
            (
                "edit without a target",
                rec_kind(9, 1, 2, 3, KIND_EDIT, 0, b"abc"),
            ),
            (
                "edit of itself",
                rec_kind(5, 1, 2, 3, KIND_EDIT, 0, &target),
            ),
            (
                "recall with text",
                rec_kind(9, 1, 2, 3, KIND_RECALL, 0, b"\x05\0\0\0\0\0\0\0x"),
            ),
            (
                "gap with a payload",
                rec_kind(9, 1, 2, 3, KIND_GAP, 0, b"x"),
            ),
            ("kind 4", rec_kind(9, 1, 2, 3, 4, 0, b"")),
        ] {
            assert!(section(r).is_err(), "{what}");
        }
        assert!(section(rec_kind(9, 1, 2, 3, KIND_GAP, 0, b"")).is_ok());
        assert!(section(rec_kind(9, 1, 2, 3, KIND_RECALL, 0, &target)).is_ok());
    }
}

/// CLUSTER_CHANGE (4.34): an action other than 1 or 2, a remove that
/// carries addresses, and node id 0 are refused.
#[test]
fn a_cluster_change_with_a_bad_action_or_a_remove_with_addresses_is_refused() {
    let good = vector_bytes("cluster_change_request");
    assert!(decode_request(&Frame::parse(&good).unwrap()).is_ok());
    // Byte 16 is the action.
    for action in [0u8, 3, 255] {
        let mut bad = good.clone();
        bad[16] = action;
        let err = decode_request(&Frame::parse(&bad).unwrap()).unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::InvalidValue {
                    field: "action",
                    ..
                }
            ),
            "{err:?}"
        );
    }
    // A remove (2) with the add's addresses.
    let mut bad = good.clone();
    bad[16] = 2;
    let err = decode_request(&Frame::parse(&bad).unwrap()).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::InvalidValue {
                field: "cluster_addr",
                ..
            }
        ),
        "{err:?}"
    );
    // Node id 0.
    let mut bad = good;
    bad[17] = 0;
    assert!(decode_request(&Frame::parse(&bad).unwrap()).is_err());
}

/// A section of a format-spec document: from the heading that starts
/// with `heading` to the next heading of any level.
fn spec_section(doc: &str, heading: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../format-spec")
        .join(doc);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("{doc}: {heading} not found"));
    let rest = &text[start + heading.len()..];
    rest[..rest.find("\n#").unwrap_or(rest.len())].to_string()
}

/// The request opcode of a name as the spec writes it (`SEND`).
fn opcode_named(name: &str) -> Opcode {
    Opcode::ALL
        .iter()
        .copied()
        .find(|op| op.name() == name)
        .unwrap_or_else(|| panic!("{name} is no request"))
}

/// protocol.md 1.5's one table of requests in flight is the code's
/// (`Opcode::in_flight`): every request in exactly one row, with the way
/// it holds back later requests and whether the in-flight limit refuses
/// it.
#[test]
fn the_in_flight_table_of_the_spec_is_the_codes() {
    let section = spec_section("protocol.md", "### 1.5 Requests in flight");
    let mut seen = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| ")).skip(1) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (names, holds, refused) = (cells[1], cells[3], cells[4]);
        for name in names.split(", ") {
            let op = opcode_named(name);
            let kind = op.in_flight();
            assert!(
                holds.starts_with(kind.spec_name()),
                "{name}: the spec says {holds:?}, the code {:?}",
                kind.spec_name()
            );
            assert_eq!(
                refused.starts_with("yes"),
                kind.is_limited(),
                "{name}: refused by the limit per the spec: {refused:?}"
            );
            seen.push(op);
        }
    }
    for op in Opcode::ALL {
        assert_eq!(
            seen.iter().filter(|&&s| s == op).count(),
            1,
            "{} in exactly one row",
            op.name()
        );
    }
}

/// The requests every member of a replica set serves, a follower too, are
/// the same list in protocol.md 4.31, cluster.md section 5.1 and the code
/// (`Opcode::served_by_every_member`).
#[test]
fn the_requests_a_follower_serves_are_one_list() {
    let want: Vec<&str> = Opcode::ALL
        .iter()
        .filter(|op| op.served_by_every_member())
        .map(|op| op.name())
        .collect();
    for (doc, heading) in [
        ("protocol.md", "### 4.31 A replica set member"),
        ("cluster.md", "## 5.1 A node of a replica set"),
    ] {
        let section = spec_section(doc, heading);
        let marker = "Served by every member:";
        let at = section
            .find(marker)
            .unwrap_or_else(|| panic!("{doc}: no {marker:?} list"));
        let list = &section[at + marker.len()..];
        let list = &list[..list.find('.').expect("the list ends with a period")];
        let mut got: Vec<&str> = list
            .split(|c: char| !(c.is_ascii_uppercase() || c == '_'))
            .filter(|w| w.len() > 1)
            .collect();
        got.sort_unstable();
        let mut want = want.clone();
        want.sort_unstable();
        assert_eq!(got, want, "{doc} {heading}");
    }
}

/// CLUSTER_CHANGE's node id 0 is a malformed frame (protocol.md 4.34 and
/// 1.6, as a group or user id of 0): the decoder refuses it, so
/// MEMBERSHIP_REFUSED never answers it.
#[test]
fn a_cluster_change_of_node_0_is_a_malformed_frame() {
    let mut bytes = vector_bytes("cluster_change_request");
    // [16] action u8, [17] node_id u64.
    bytes[17..25].copy_from_slice(&0u64.to_le_bytes());
    let frame = Frame::parse(&bytes).unwrap();
    let e = decode_request(&frame).unwrap_err();
    assert!(e.to_string().contains("node_id"), "{e}");
}
