//! Tests of the run and manifest formats, the merge and its policy:
//! round trips, damage to every byte, the part limit, the masking table,
//! and a property test against a `BTreeMap` model of the state.
//!
//! The model: groups with a head and members with a cursor, changed by
//! random operations; a "checkpoint" writes the delta run the engine's
//! capture writes (a record per changed group, `fresh` on its first
//! capture, rows of changed memberships, tombstones of deleted groups and
//! rows); "merges" combine the newest runs. After every step the merge of
//! all runs must equal the model as of the last checkpoint. Left out: the
//! engine's locks and files (tested in the engine's checkpoint tests).

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::merge::{plan, Merge};
use super::run::*;
use super::{GroupRecord, Item, Key, Reader, SmallRecord};
use crate::logs::retention::Retention;

fn group(group: u64, fresh: bool, head: u64) -> Item {
    Item::GroupPut(Box::new(GroupRecord {
        group,
        fresh,
        applied_lsn: 7 << 32 | head,
        head,
        segments: vec![(1, 64 + head)],
        retention: Retention::default(),
        damaged: None,
        small: None,
        quiet: Vec::new(),
        edits: Vec::new(),
        erase: Vec::new(),
    }))
}

fn member(group: u64, user: u64, cursor: u64) -> Item {
    Item::MemberPut {
        group,
        user,
        cursor,
        join_point: cursor.saturating_sub(3),
    }
}

/// Writes `items` as one run into in-memory parts.
fn write_run(items: &[Item], part_bytes_max: u64) -> Vec<(Vec<u8>, PartMeta)> {
    let mut w = RunWriter::new(5, part_bytes_max, 1234, |_| Ok(Vec::new()));
    for it in items {
        w.push(it).unwrap();
    }
    w.finish().unwrap()
}

/// Reads the parts of a run back, checking each against its description.
fn read_run(parts: &[(Vec<u8>, PartMeta)]) -> Result<Vec<Item>, String> {
    let mut out = Vec::new();
    for (bytes, meta) in parts {
        let mut r = PartReader::open(bytes, RUN_FILE_BYTES_READ_MAX)?;
        if (
            r.run_seq,
            r.part,
            r.item_count,
            r.trailer_crc,
            r.first_key()?,
        ) != (
            meta.run_seq,
            meta.part,
            meta.item_count,
            meta.trailer_crc,
            meta.first_key,
        ) {
            return Err("part differs from its description".into());
        }
        for item in r.by_ref() {
            out.push(item?);
        }
        if r.last_key() != Some(meta.last_key) {
            return Err("last key differs from the description".into());
        }
    }
    Ok(out)
}

fn sample_items() -> Vec<Item> {
    vec![
        group(1, true, 0),
        member(1, 0, 0),
        member(1, 5, 1 << 40),
        Item::MemberDelete { group: 1, user: 6 },
        Item::GroupDelete { group: 2 },
        Item::GroupPut(Box::new(GroupRecord {
            group: 3,
            fresh: false,
            // The largest a reader takes (below 2^62, the group's word).
            applied_lsn: crate::commit::journal::LSN_MAX,
            head: u64::MAX - 1,
            segments: vec![(1, 64), (5, 1 << 31), (u64::MAX, 64)],
            retention: Retention {
                by_cursor: true,
                max_age_ms: 9,
                max_bytes: 0,
            },
            damaged: Some("bad crc at 12 ü".into()),
            small: None,
            quiet: Vec::new(),
            edits: Vec::new(),
            erase: Vec::new(),
        })),
        member(3, u64::MAX, 2),
        Item::MemberPut {
            group: u64::MAX,
            user: 1,
            cursor: 0,
            join_point: u64::MAX,
        },
    ]
}

#[test]
fn runs_round_trip_in_one_part_or_many() {
    let items = sample_items();
    for max in [RUN_FILE_BYTES_MIN, 4096, RUN_FILE_BYTES_READ_MAX] {
        let parts = write_run(&items, max);
        assert!(parts
            .iter()
            .all(|(b, m)| b.len() as u64 == m.file_len && m.file_len <= max));
        assert_eq!(read_run(&parts).unwrap(), items, "max {max}");
    }
    let many: Vec<Item> = (0..2000).map(|u| member(9, u * 3, u)).collect();
    let parts = write_run(&many, 4096);
    assert!(parts.len() > 3, "{} parts", parts.len());
    for w in parts.windows(2) {
        assert!(w[0].1.last_key < w[1].1.first_key);
        assert_eq!(w[0].1.part + 1, w[1].1.part);
    }
    assert_eq!(read_run(&parts).unwrap(), many);
    assert!(write_run(&[], 4096).is_empty());
}

#[test]
fn every_flipped_bit_and_every_truncation_of_a_part_is_detected() {
    let parts = write_run(&sample_items(), 1 << 20);
    assert_eq!(parts.len(), 1);
    let bytes = &parts[0].0;
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[i] ^= 1 << bit;
            let got = read_run(&[(b, parts[0].1.clone())]);
            assert!(got.is_err(), "byte {i} bit {bit}: {got:?}");
        }
    }
    for n in 0..bytes.len() {
        assert!(
            read_run(&[(bytes[..n].to_vec(), parts[0].1.clone())]).is_err(),
            "cut to {n}"
        );
    }
}

#[test]
fn the_reader_refuses_a_part_over_its_limit_and_the_writer_never_writes_one() {
    let parts = write_run(&sample_items(), 1 << 20);
    let len = parts[0].0.len() as u64;
    assert!(PartReader::open(&parts[0].0, len).is_ok());
    assert!(PartReader::open(&parts[0].0, len - 1)
        .err()
        .is_some_and(|e| e.contains("limit")));
    // An item that cannot fit an empty part is refused, not written.
    let huge = Item::GroupPut(Box::new(GroupRecord {
        group: 1,
        fresh: false,
        applied_lsn: 0,
        head: 10_000,
        segments: (1..=600).map(|b| (b, 64)).collect(),
        retention: Retention::default(),
        damaged: None,
        small: None,
        quiet: Vec::new(),
        edits: Vec::new(),
        erase: Vec::new(),
    }));
    let mut w = RunWriter::new(1, RUN_FILE_BYTES_MIN, 0, |_| Ok(Vec::new()));
    assert!(matches!(
        w.push(&huge),
        Err(WriteError::ItemTooLarge { .. })
    ));
    let mut w = RunWriter::new(1, 4096, 0, |_| Ok(Vec::new()));
    w.push(&member(1, 2, 3)).unwrap();
    assert!(matches!(
        w.push(&member(1, 2, 4)),
        Err(WriteError::OutOfOrder { .. })
    ));
}

/// A part whose one block holds `raw` item bytes (`count` items), with
/// every checksum valid: what refuses it is the field checks.
fn part_with_raw_items(raw: &[u8], count: u32, first: Key) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&RUN_MAGIC);
    out.extend_from_slice(&RUN_VERSION.to_le_bytes());
    out.extend_from_slice(&(RUN_HEADER_BYTES as u16).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&5u64.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&[0; 28]);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    let mut block = vec![0u8; BLOCK_HEADER_BYTES];
    block.extend_from_slice(raw);
    let len = block.len() as u32;
    block[4..8].copy_from_slice(&len.to_le_bytes());
    block[8..12].copy_from_slice(&count.to_le_bytes());
    let crc = crc32fast::hash(&block[4..]);
    block[0..4].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&block);
    let mut index = Vec::new();
    index.extend_from_slice(&(RUN_HEADER_BYTES as u64).to_le_bytes());
    index.extend_from_slice(&len.to_le_bytes());
    super::put_key(&mut index, first);
    let index_offset = out.len() as u64;
    out.extend_from_slice(&index);
    let mut t = Vec::new();
    t.extend_from_slice(&RUN_TRAILER_MAGIC);
    t.extend_from_slice(&index_offset.to_le_bytes());
    t.extend_from_slice(&u64::from(count).to_le_bytes());
    t.extend_from_slice(&1u32.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&index);
    crc.update(&t);
    t.extend_from_slice(&crc.finalize().to_le_bytes());
    out.extend_from_slice(&t);
    out
}

fn decode_raw(raw: &[u8], count: u32, first: Key) -> Result<Vec<Item>, String> {
    PartReader::open(
        &part_with_raw_items(raw, count, first),
        RUN_FILE_BYTES_READ_MAX,
    )?
    .collect()
}

#[test]
fn raw_blocks_pass_and_values_no_writer_makes_are_refused_behind_valid_checksums() {
    let mut raw = Vec::new();
    encode_item(&mut raw, &member(1, 2, 3), None);
    encode_item(&mut raw, &member(1, 4, 3), Some(Key::member(1, 2)));
    assert_eq!(decode_raw(&raw, 2, Key::member(1, 2)).unwrap().len(), 2);
    // The count in the block header disagrees with the items.
    assert!(decode_raw(&raw, 1, Key::member(1, 2)).is_err());
    // The index names another first key.
    assert!(decode_raw(&raw, 2, Key::member(1, 3)).is_err());
    // A key that does not increase: user delta 0.
    let mut raw = Vec::new();
    encode_item(&mut raw, &member(1, 2, 3), None);
    raw.extend_from_slice(&[3, 0, 0, 3, 0]);
    assert!(decode_raw(&raw, 2, Key::member(1, 2)).is_err());
    // Invalid kinds.
    for kind in [0u8, 5, 255] {
        assert!(
            decode_raw(&[kind, 1, 0, 0], 1, Key::group(1)).is_err(),
            "kind {kind}"
        );
    }
    // Group values a writer never makes.
    let good = |g: GroupRecord| {
        let mut raw = Vec::new();
        encode_item(&mut raw, &Item::GroupPut(Box::new(g)), None);
        raw
    };
    let base = GroupRecord {
        group: 1,
        fresh: false,
        applied_lsn: 0,
        head: 10,
        segments: vec![(1, 64), (5, 100)],
        retention: Retention::default(),
        damaged: None,
        small: None,
        quiet: Vec::new(),
        edits: Vec::new(),
        erase: Vec::new(),
    };
    assert!(decode_raw(&good(base.clone()), 1, Key::group(1)).is_ok());
    for (what, bad) in [
        (
            "base 0",
            GroupRecord {
                segments: vec![(0, 64)],
                ..base.clone()
            },
        ),
        (
            "short segment",
            GroupRecord {
                segments: vec![(1, 63)],
                ..base.clone()
            },
        ),
        (
            "applied_lsn at 2^62",
            GroupRecord {
                applied_lsn: crate::commit::journal::LSN_MAX + 1,
                ..base.clone()
            },
        ),
        (
            "base above head + 1",
            GroupRecord {
                segments: vec![(1, 64), (12, 64)],
                ..base.clone()
            },
        ),
    ] {
        assert!(decode_raw(&good(bad), 1, Key::group(1)).is_err(), "{what}");
    }
    // A group with no file (storage v2 S5: created, no record yet): no
    // segment, head 0, exactly these bytes (format-spec/storage.md 6.1);
    // no segment with a head above 0 is refused.
    let fileless = GroupRecord {
        head: 0,
        segments: Vec::new(),
        ..base.clone()
    };
    assert_eq!(good(fileless.clone()), [1, 1, 0, 0, 0, 0]);
    assert_eq!(
        decode_raw(&good(fileless.clone()), 1, Key::group(1)).unwrap(),
        [Item::GroupPut(Box::new(fileless))]
    );
    assert!(decode_raw(&[1, 1, 0, 0, 3, 0], 1, Key::group(1)).is_err());
    // A small group (storage v2 S5): bit 3, no segment, its extents, exactly
    // these bytes (format-spec/storage.md 6.1): three records, ids 1..=3, in
    // 150 bytes at offset 100 of journal file 2.
    let small = GroupRecord {
        head: 3,
        segments: Vec::new(),
        small: Some(SmallRecord {
            first_id: 1,
            floor: 1,
            extents: vec![(2, 100, 150, 3)],
        }),
        ..base.clone()
    };
    let small_bytes = [1, 1, 8, 0, 3, 0, 1, 0, 1, 2, 0x64, 0x96, 0x01, 3];
    assert_eq!(good(small.clone()), small_bytes);
    assert_eq!(
        decode_raw(&small_bytes, 1, Key::group(1)).unwrap(),
        [Item::GroupPut(Box::new(small.clone()))]
    );
    // Retention raised the floor inside the first extent (to 3), or
    // dropped every record (no extent, first_id = floor = head + 1).
    let trimmed = [1, 1, 8, 0, 3, 0, 1, 2, 1, 2, 0x64, 0x96, 0x01, 3];
    let emptied = [1, 1, 8, 0, 3, 0, 4, 0, 0];
    for (bytes, first_id, floor, extents) in [
        (&trimmed[..], 1, 3, vec![(2, 100, 150, 3)]),
        (&emptied[..], 4, 4, vec![]),
    ] {
        let item = GroupRecord {
            small: Some(SmallRecord {
                first_id,
                floor,
                extents,
            }),
            ..small.clone()
        };
        assert_eq!(good(item.clone()), bytes);
        assert_eq!(
            decode_raw(bytes, 1, Key::group(1)).unwrap(),
            [Item::GroupPut(Box::new(item))]
        );
    }
    // Extents that do not end at the head, a segment beside bit 3, a count
    // too small for its bytes' records, no extent without a dropped head
    // (head 0, or first_id not head + 1, or a floor above it), and a floor
    // past the first extent are refused.
    for bad in [
        &[1, 1, 8, 0, 4, 0, 1, 0, 1, 2, 0x64, 0x96, 0x01, 3][..],
        &[1, 1, 8, 0, 3, 1, 1, 64, 1, 0, 1, 2, 0x64, 0x96, 0x01, 3][..],
        &[1, 1, 8, 0, 3, 0, 1, 0, 1, 2, 0x64, 10, 3][..],
        &[1, 1, 8, 0, 0, 0, 1, 0, 0][..],
        &[1, 1, 8, 0, 3, 0, 3, 0, 0][..],
        &[1, 1, 8, 0, 3, 0, 4, 1, 0][..],
        &[1, 1, 8, 0, 3, 0, 1, 3, 1, 2, 0x64, 0x96, 0x01, 3][..],
    ] {
        assert!(decode_raw(bad, 1, Key::group(1)).is_err(), "{bad:?}");
    }
    // Segments whose bases do not rise: patch the second delta to 0.
    let mut raw = good(base.clone());
    // kind, group, flags, lsn, head, m, base0, len0, delta1, len1
    assert_eq!(&raw[..8], &[1, 1, 0, 0, 10, 2, 1, 64]);
    raw[8] = 0;
    assert!(decode_raw(&raw, 1, Key::group(1)).is_err());
    // Reserved flag bits, and the retention flag with the default policy.
    let mut raw = good(base.clone());
    raw[2] = 8;
    assert!(decode_raw(&raw, 1, Key::group(1)).is_err());
    let mut raw = good(base.clone());
    raw[2] = 4;
    raw.extend_from_slice(&[0, 0, 0]);
    assert!(decode_raw(&raw, 1, Key::group(1)).is_err());
    let mut raw = good(base.clone());
    raw[2] = 4;
    raw.extend_from_slice(&[2, 1, 0]); // by_cursor 2
    assert!(decode_raw(&raw, 1, Key::group(1)).is_err());
    // A damage reason that is not UTF-8, or too long.
    let mut raw = good(base.clone());
    raw[2] = 2;
    raw.extend_from_slice(&[2, 0xff, 0xfe]);
    assert!(decode_raw(&raw, 1, Key::group(1)).is_err());
    let mut raw = good(base.clone());
    raw[2] = 2;
    super::put_varint(&mut raw, DAMAGE_REASON_BYTES_MAX as u64 + 1);
    raw.extend(std::iter::repeat_n(b'x', DAMAGE_REASON_BYTES_MAX + 1));
    assert!(decode_raw(&raw, 1, Key::group(1)).is_err());
    // A hostile segment count fails before allocating.
    let mut raw = vec![1, 1, 0, 0, 10];
    super::put_varint(&mut raw, u64::MAX);
    assert!(decode_raw(&raw, 1, Key::group(1)).is_err());
    // Trailing bytes in a block.
    let mut raw = Vec::new();
    encode_item(&mut raw, &member(1, 2, 3), None);
    raw.push(0);
    assert!(decode_raw(&raw, 1, Key::member(1, 2)).is_err());
    let _ = Reader::new(&[]);
}

#[test]
fn long_damage_reasons_are_cut_at_a_char_boundary() {
    let reason = "é".repeat(DAMAGE_REASON_BYTES_MAX);
    let item = Item::GroupPut(Box::new(GroupRecord {
        group: 1,
        fresh: false,
        applied_lsn: 0,
        head: 0,
        segments: vec![(1, 64)],
        retention: Retention::default(),
        damaged: Some(reason.clone()),
        small: None,
        quiet: Vec::new(),
        edits: Vec::new(),
        erase: Vec::new(),
    }));
    let got = read_run(&write_run(&[item], 1 << 20)).unwrap();
    let Item::GroupPut(g) = &got[0] else { panic!() };
    assert_eq!(g.damaged.as_deref(), Some(stored_reason(&reason).as_str()));
    assert_eq!(g.damaged.as_ref().unwrap().len(), DAMAGE_REASON_BYTES_MAX);
}

#[test]
fn part_file_names() {
    assert_eq!(part_file_name(12, 3), "00000000000000000012-0003.tmr");
    assert_eq!(
        parse_part_file_name("00000000000000000012-0003.tmr"),
        Some((12, 3))
    );
    assert_eq!(
        parse_part_file_name("00000000000000000012-12345.tmr"),
        Some((12, 12345))
    );
    assert_eq!(parse_part_file_name("12-0003.tmr"), None);
    assert_eq!(parse_part_file_name("00000000000000000012-0003.tmp"), None);
}

// ---------------------------------------------------------------------------
// merge

fn merge(runs: Vec<Vec<Item>>, includes_oldest: bool) -> Vec<Item> {
    let inputs = runs.into_iter().map(|r| r.into_iter().map(Ok)).collect();
    Merge::new(inputs, includes_oldest)
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

#[test]
fn merge_masking_table() {
    let del = |g| Item::GroupDelete { group: g };
    let iput = |user, group| Item::IndexPut { user, group };
    let idel = |user, group| Item::IndexDelete { user, group };
    let mdel = |g, u| Item::MemberDelete { group: g, user: u };
    // (name, runs newest first, output of a partial merge, output of a full merge)
    type Case = (&'static str, Vec<Vec<Item>>, Vec<Item>, Vec<Item>);
    let cases: Vec<Case> = vec![
        (
            "newest wins per key",
            vec![
                vec![group(1, false, 5), member(1, 2, 5)],
                vec![group(1, true, 3), member(1, 2, 1), member(1, 3, 1)],
            ],
            vec![group(1, true, 5), member(1, 2, 5), member(1, 3, 1)],
            vec![group(1, false, 5), member(1, 2, 5), member(1, 3, 1)],
        ),
        (
            "a fresh record hides the old incarnation's rows",
            vec![
                vec![group(1, true, 0), member(1, 9, 0)],
                vec![group(1, false, 7), member(1, 2, 7)],
            ],
            vec![group(1, true, 0), member(1, 9, 0)],
            vec![group(1, false, 0), member(1, 9, 0)],
        ),
        (
            "a delete hides everything older and goes with the oldest run",
            vec![
                vec![del(1)],
                vec![group(1, true, 7), member(1, 2, 7)],
                vec![group(2, true, 1)],
            ],
            vec![del(1), group(2, true, 1)],
            vec![group(2, false, 1)],
        ),
        (
            "delete then create: rows of the new incarnation only",
            vec![
                vec![group(1, true, 0), member(1, 4, 0)],
                vec![del(1)],
                vec![group(1, false, 9), member(1, 2, 9)],
            ],
            vec![group(1, true, 0), member(1, 4, 0)],
            vec![group(1, false, 0), member(1, 4, 0)],
        ),
        (
            "member tombstones hide older rows, then go",
            vec![
                vec![group(1, false, 3), mdel(1, 2)],
                vec![group(1, false, 2), member(1, 2, 2), member(1, 3, 2)],
            ],
            vec![group(1, false, 3), mdel(1, 2), member(1, 3, 2)],
            vec![group(1, false, 3), member(1, 3, 2)],
        ),
        (
            "a member tombstone under a fresh record is dropped",
            vec![
                vec![group(1, true, 3), mdel(1, 2)],
                vec![group(1, false, 2), member(1, 2, 2)],
            ],
            vec![group(1, true, 3)],
            vec![group(1, false, 3)],
        ),
        (
            "rows without a record pass a partial merge; orphans go with the oldest",
            vec![vec![member(1, 2, 2), mdel(1, 3)], vec![]],
            vec![member(1, 2, 2), mdel(1, 3)],
            vec![],
        ),
        (
            "a fresh record below a newer one keeps masking",
            vec![
                vec![group(1, false, 4)],
                vec![group(1, true, 2)],
                vec![group(1, false, 9), member(1, 5, 9)],
            ],
            vec![group(1, true, 4)],
            vec![group(1, false, 4)],
        ),
        (
            "a group's masking items hide no index entry of the user with its id",
            vec![
                vec![del(1), group(2, true, 0)],
                vec![
                    group(1, false, 3),
                    member(1, 2, 3),
                    iput(1, 7),
                    iput(2, 1),
                    iput(2, 5),
                ],
            ],
            vec![
                del(1),
                iput(1, 7),
                group(2, true, 0),
                iput(2, 1),
                iput(2, 5),
            ],
            vec![iput(1, 7), group(2, false, 0), iput(2, 1), iput(2, 5)],
        ),
        (
            "index entries: newest wins, deletes go with the oldest run",
            vec![vec![idel(3, 1), iput(3, 2)], vec![iput(3, 1), idel(3, 2)]],
            vec![idel(3, 1), iput(3, 2)],
            vec![iput(3, 2)],
        ),
    ];
    for (name, runs, partial, full) in cases {
        let n = runs.len();
        // Partial: the runs merged with one (empty) older run outside.
        assert_eq!(merge(runs.clone(), false), partial, "{name}: partial");
        assert_eq!(merge(runs.clone(), true), full, "{name}: full");
        // A partial merge followed by a full one equals the full merge.
        assert_eq!(
            merge(vec![partial], true),
            full,
            "{name}: partial then full ({n} runs)"
        );
    }
}

/// The user index's items (storage.md 6.1, kinds 5 and 6): exactly the
/// documented bytes, after a member row of the group whose id is the
/// user's, and found by a lookup of the user's entries.
#[test]
fn index_items_as_documented() {
    let items = vec![
        Item::MemberPut {
            group: 7,
            user: 5,
            cursor: 0,
            join_point: 1,
        },
        Item::IndexPut { user: 7, group: 3 },
        Item::IndexDelete { user: 7, group: 5 },
    ];
    let mut raw = Vec::new();
    let mut prev = None;
    for it in &items {
        encode_item(&mut raw, it, prev);
        prev = Some(it.key());
    }
    assert_eq!(
        raw,
        [0x03, 0x07, 0x05, 0x00, 0x00, 0x05, 0x00, 0x03, 0x06, 0x00, 0x02]
    );
    assert_eq!(decode_raw(&raw, 3, Key::member(7, 5)).unwrap(), items);
    // The user's entries, newest run first, through the block indexes.
    let newer = write_run(
        &[group(6, false, 0), Item::IndexDelete { user: 7, group: 3 }],
        RUN_FILE_BYTES_MIN,
    );
    let older = write_run(
        &[
            group(7, false, 0),
            member(7, 5, 0),
            Item::IndexPut { user: 7, group: 3 },
            Item::IndexPut { user: 7, group: 9 },
            Item::IndexPut { user: 8, group: 1 },
        ],
        RUN_FILE_BYTES_MIN,
    );
    let slices: Vec<Vec<&[u8]>> = [&newer, &older]
        .iter()
        .map(|r| r.iter().map(|(b, _)| &b[..]).collect())
        .collect();
    let metas: Vec<Vec<PartMeta>> = [&newer, &older]
        .iter()
        .map(|r| r.iter().map(|(_, m)| m.clone()).collect())
        .collect();
    let parts: Vec<&[PartMeta]> = metas.iter().map(|m| &m[..]).collect();
    assert_eq!(
        crate::state::lazy::index_of_user(&slices, &parts, 7).unwrap(),
        vec![9]
    );
    assert_eq!(
        crate::state::lazy::index_of_user(&slices, &parts, 8).unwrap(),
        vec![1]
    );
    assert!(crate::state::lazy::index_of_user(&slices, &parts, 6)
        .unwrap()
        .is_empty());
}

#[test]
fn merge_reports_input_errors_and_keys_that_do_not_increase() {
    let bad: Vec<Result<Item, String>> = vec![Ok(member(1, 2, 0)), Err("boom".into())];
    let ok: Vec<Result<Item, String>> = vec![Ok(group(1, true, 0))];
    let got: Vec<_> = Merge::new(vec![bad.into_iter(), ok.into_iter()], true).collect();
    assert!(got.iter().any(|r| r.as_ref().is_err_and(|e| e == "boom")));
    assert!(got.last().unwrap().is_err(), "an error ends the merge");
    let unsorted: Vec<Result<Item, String>> = vec![Ok(member(1, 3, 0)), Ok(member(1, 2, 0))];
    let got: Vec<_> = Merge::new(vec![unsorted.into_iter()], true).collect();
    assert!(got.iter().any(|r| r.is_err()));
}

#[test]
fn the_merge_policy_keeps_each_run_larger_than_all_newer_ones() {
    assert_eq!(plan(&[]), 0);
    assert_eq!(plan(&[5]), 0);
    assert_eq!(plan(&[5, 6]), 0);
    assert_eq!(plan(&[5, 5]), 2);
    assert_eq!(plan(&[1, 3, 3]), 3, "3 <= 1 + 3: merge all three");
    assert_eq!(plan(&[1, 1, 3]), 2);
    assert_eq!(plan(&[1, 2, 4, 100]), 0);
    assert_eq!(
        plan(&[1, 2, 2, 100, 50]),
        5,
        "the oldest run that breaks the rule decides"
    );
}

proptest! {
    #[test]
    fn the_policy_bounds_runs_and_rewrites(deltas in proptest::collection::vec(1u64..1000, 1..300)) {
        // Sizes only (no duplicates dropped): the worst case of the bounds.
        let mut runs: Vec<(u64, u32)> = Vec::new(); // (bytes, max rewrites of an item in it)
        let mut total = 0u64;
        for d in deltas {
            total += d;
            runs.insert(0, (d, 0));
            let n = plan(&runs.iter().map(|r| r.0).collect::<Vec<_>>());
            if n > 0 {
                let merged: Vec<_> = runs.drain(..n).collect();
                let bytes = merged.iter().map(|r| r.0).sum();
                let rewrites = merged.iter().map(|r| r.1).max().unwrap() + 1;
                runs.insert(0, (bytes, rewrites));
            }
            for k in 1..runs.len() {
                let newer: u64 = runs[..k].iter().map(|r| r.0).sum();
                prop_assert!(runs[k].0 > newer, "run {k} not larger than the newer ones: {runs:?}");
            }
            let log2 = |x: u64| 64 - x.leading_zeros();
            prop_assert!(runs.len() as u32 <= 1 + log2(total), "{} runs for {total} bytes", runs.len());
            for r in &runs {
                prop_assert!(r.1 <= 1 + log2(total), "{} rewrites for {total} bytes", r.1);
            }
        }
    }
}

/// The model of the state, and of what changed since the last checkpoint.
#[derive(Default)]
struct Model {
    groups: BTreeMap<u64, ModelGroup>,
    /// Groups changed since the last checkpoint (present or deleted).
    dirty: BTreeSet<u64>,
    lsn: u64,
}

#[derive(Clone)]
struct ModelGroup {
    head: u64,
    lsn: u64,
    members: BTreeMap<u64, u64>,
    captured_once: bool,
    changed_members: BTreeSet<u64>,
}

#[derive(Clone, Debug)]
enum Op {
    Create(u64),
    Delete(u64),
    Send(u64),
    Join(u64, u64),
    Leave(u64, u64),
    Ack(u64, u64),
    Checkpoint,
    Merge(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let g = 0..6u64;
    let u = 0..5u64;
    prop_oneof![
        2 => g.clone().prop_map(Op::Create),
        1 => g.clone().prop_map(Op::Delete),
        3 => g.clone().prop_map(Op::Send),
        3 => (g.clone(), u.clone()).prop_map(|(g, u)| Op::Join(g, u)),
        1 => (g.clone(), u.clone()).prop_map(|(g, u)| Op::Leave(g, u)),
        2 => (g, u).prop_map(|(g, u)| Op::Ack(g, u)),
        2 => Just(Op::Checkpoint),
        1 => (2..5usize).prop_map(Op::Merge),
    ]
}

impl Model {
    fn apply(&mut self, op: &Op) {
        self.lsn += 1;
        let lsn = self.lsn;
        match *op {
            Op::Create(g) => {
                if self.groups.contains_key(&g) {
                    return;
                }
                self.groups.insert(
                    g,
                    ModelGroup {
                        head: 0,
                        lsn,
                        members: BTreeMap::new(),
                        captured_once: false,
                        changed_members: BTreeSet::new(),
                    },
                );
            }
            Op::Delete(g) => {
                if self.groups.remove(&g).is_none() {
                    return;
                }
            }
            Op::Send(g) | Op::Join(g, _) | Op::Leave(g, _) | Op::Ack(g, _) => {
                let Some(st) = self.groups.get_mut(&g) else {
                    return;
                };
                st.lsn = lsn;
                match *op {
                    Op::Send(_) => st.head += 1,
                    Op::Join(_, u) => {
                        st.members.entry(u).or_insert(st.head);
                        st.changed_members.insert(u);
                    }
                    Op::Leave(_, u) => {
                        st.members.remove(&u);
                        st.changed_members.insert(u);
                    }
                    Op::Ack(_, u) => {
                        if let Some(c) = st.members.get_mut(&u) {
                            *c = st.head;
                            st.changed_members.insert(u);
                        }
                    }
                    _ => unreachable!(),
                }
            }
            Op::Checkpoint | Op::Merge(_) => return,
        }
        self.dirty.insert(op_group(op));
    }

    fn record(g: u64, st: &ModelGroup, fresh: bool) -> Item {
        Item::GroupPut(Box::new(GroupRecord {
            group: g,
            fresh,
            applied_lsn: st.lsn,
            head: st.head,
            segments: vec![(1, 64 + st.head)],
            retention: Retention::default(),
            damaged: None,
            small: None,
            quiet: Vec::new(),
            edits: Vec::new(),
            erase: Vec::new(),
        }))
    }

    /// The delta run the engine's capture writes.
    fn capture(&mut self) -> Vec<Item> {
        let mut out = Vec::new();
        for g in std::mem::take(&mut self.dirty) {
            match self.groups.get_mut(&g) {
                None => out.push(Item::GroupDelete { group: g }),
                Some(st) => {
                    let fresh = !st.captured_once;
                    st.captured_once = true;
                    out.push(Model::record(g, st, fresh));
                    for u in std::mem::take(&mut st.changed_members) {
                        out.push(match st.members.get(&u) {
                            Some(&c) => member_row(g, u, c),
                            None => Item::MemberDelete { group: g, user: u },
                        });
                    }
                }
            }
        }
        out
    }

    /// The whole state as a full merge yields it.
    fn state(&self) -> Vec<Item> {
        let mut out = Vec::new();
        for (&g, st) in &self.groups {
            out.push(Model::record(g, st, false));
            for (&u, &c) in &st.members {
                out.push(member_row(g, u, c));
            }
        }
        out
    }
}

fn member_row(g: u64, u: u64, cursor: u64) -> Item {
    Item::MemberPut {
        group: g,
        user: u,
        cursor,
        join_point: 1,
    }
}

fn op_group(op: &Op) -> u64 {
    match *op {
        Op::Create(g) | Op::Delete(g) | Op::Send(g) => g,
        Op::Join(g, _) | Op::Leave(g, _) | Op::Ack(g, _) => g,
        Op::Checkpoint | Op::Merge(_) => unreachable!(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn merged_runs_equal_a_btreemap_model(
        ops in proptest::collection::vec(op(), 1..120),
        part_max in prop_oneof![Just(RUN_FILE_BYTES_MIN), Just(1u64 << 20)],
    ) {
        let mut model = Model::default();
        // Runs newest first, each stored as parts and read back.
        let mut runs: Vec<Vec<Item>> = Vec::new();
        let mut expected = Vec::new();
        for op in &ops {
            match op {
                Op::Checkpoint => {
                    let delta = model.capture();
                    if delta.is_empty() {
                        continue;
                    }
                    let stored = read_run(&write_run(&delta, part_max)).unwrap();
                    prop_assert_eq!(&stored, &delta);
                    runs.insert(0, stored);
                    expected = model.state();
                }
                Op::Merge(k) => {
                    let k = (*k).min(runs.len());
                    if k < 2 {
                        continue;
                    }
                    let merged = merge(runs.drain(..k).collect(), runs.is_empty());
                    let stored = read_run(&write_run(&merged, part_max)).unwrap();
                    if !stored.is_empty() {
                        runs.insert(0, stored);
                    }
                }
                other => model.apply(other),
            }
            prop_assert_eq!(&merge(runs.clone(), true), &expected, "after {:?}", op);
        }
    }
}

/// A group record's quiet ids (GroupPut bit 4,
/// format-spec/storage.md 6.1), exactly these bytes, and the values no
/// writer makes.
mod quiet_ids {
    use super::*;

    #[test]
    fn quiet_ids_round_trip_as_documented_and_bad_lists_are_refused() {
        let rec = GroupRecord {
            group: 1,
            fresh: false,
            applied_lsn: 0,
            head: 9,
            segments: vec![(1, 64)],
            retention: Retention::default(),
            damaged: None,
            small: None,
            quiet: vec![3, 5, 9],
            edits: Vec::new(),
            erase: Vec::new(),
        };
        let mut raw = Vec::new();
        encode_item(&mut raw, &Item::GroupPut(Box::new(rec.clone())), None);
        // GroupPut, group 1, flags 0x10, applied_lsn 0, head 9, one
        // segment (1, 64), three quiet ids 3, +2, +4.
        let bytes = [1, 1, 0x10, 0, 9, 1, 1, 64, 3, 3, 2, 4];
        assert_eq!(raw, bytes);
        assert_eq!(
            decode_raw(&bytes, 1, Key::group(1)).unwrap(),
            [Item::GroupPut(Box::new(rec))]
        );
        for bad in [
            &[1, 1, 0x10, 0, 9, 1, 1, 64, 0][..],     // no id
            &[1, 1, 0x10, 0, 9, 1, 1, 64, 2, 3, 0],   // not rising
            &[1, 1, 0x10, 0, 9, 1, 1, 64, 1, 0],      // id 0
            &[1, 1, 0x10, 0, 9, 1, 1, 64, 1, 10],     // above the head
            &[1, 1, 0x10, 0, 9, 1, 1, 64, 200, 1, 1], // count past the end
            &[1, 1, 0x20, 0, 9, 1, 1, 64],            // reserved bit 5
        ] {
            assert!(decode_raw(bad, 1, Key::group(1)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn latest_edits_round_trip_as_documented_and_bad_lists_are_refused() {
        let rec = GroupRecord {
            group: 1,
            fresh: false,
            applied_lsn: 0,
            head: 9,
            segments: vec![(1, 64)],
            retention: Retention::default(),
            damaged: None,
            small: None,
            quiet: vec![4, 7],
            edits: vec![(2, 4), (3, 7)],
            erase: Vec::new(),
        };
        let mut raw = Vec::new();
        encode_item(&mut raw, &Item::GroupPut(Box::new(rec.clone())), None);
        // flags 0x30 (quiet, edits); quiet 4, +3; edits (2, +2), (+1, +4).
        let bytes = [1, 1, 0x30, 0, 9, 1, 1, 64, 2, 4, 3, 2, 2, 2, 1, 4];
        assert_eq!(raw, bytes);
        assert_eq!(
            decode_raw(&bytes, 1, Key::group(1)).unwrap(),
            [Item::GroupPut(Box::new(rec))]
        );
        for bad in [
            &[1, 1, 0x20, 0, 9, 1, 1, 64, 0][..],         // no entry
            &[1, 1, 0x20, 0, 9, 1, 1, 64, 1, 2, 0],       // edit not above
            &[1, 1, 0x20, 0, 9, 1, 1, 64, 1, 0, 2],       // message 0
            &[1, 1, 0x20, 0, 9, 1, 1, 64, 1, 5, 5],       // edit above the head
            &[1, 1, 0x20, 0, 9, 1, 1, 64, 2, 1, 1, 0, 1], // not rising
            &[1, 1, 0x80, 0, 9, 1, 1, 64],                // reserved bit 7
        ] {
            assert!(decode_raw(bad, 1, Key::group(1)).is_err(), "{bad:?}");
        }
    }
}

/// Erasure of recalled messages in segments (GroupPut bit 6,
/// format-spec/storage.md 6.1): the erase list, exactly these bytes, and
/// the values no writer makes.
mod erase_list {
    use super::*;

    #[test]
    fn erase_list_round_trips_as_documented_and_bad_lists_are_refused() {
        let rec = GroupRecord {
            group: 1,
            fresh: false,
            applied_lsn: 0,
            head: 9,
            segments: vec![(1, 64)],
            retention: Retention::default(),
            damaged: None,
            small: None,
            quiet: vec![3, 9],
            edits: Vec::new(),
            erase: vec![3],
        };
        let mut raw = Vec::new();
        encode_item(&mut raw, &Item::GroupPut(Box::new(rec.clone())), None);
        // flags 0x50 (quiet, erase); quiet 3, +6; erase 3.
        let bytes = [1, 1, 0x50, 0, 9, 1, 1, 64, 2, 3, 6, 1, 3];
        assert_eq!(raw, bytes);
        assert_eq!(
            decode_raw(&bytes, 1, Key::group(1)).unwrap(),
            [Item::GroupPut(Box::new(rec))]
        );
        for bad in [
            &[1, 1, 0x40, 0, 9, 1, 1, 64, 0][..],   // no id
            &[1, 1, 0x40, 0, 9, 1, 1, 64, 2, 3, 0], // not rising
            &[1, 1, 0x40, 0, 9, 1, 1, 64, 1, 10],   // above the head
            &[1, 1, 0x40, 0, 9, 1, 1, 64, 9, 1],    // count past the end
            &[1, 1, 0x80, 0, 9, 1, 1, 64],          // reserved bit 7
        ] {
            assert!(decode_raw(bad, 1, Key::group(1)).is_err(), "{bad:?}");
        }
    }
}

/// A group taken from the runs by its key alone (the background load's
/// lookup, `lazy::items_of_group`: each run read from the block its index
/// names) is exactly what the full merge yields for it, over runs of
/// several parts of several blocks each, with deletions, re-creations and
/// leaves masked across runs, and for ids no run holds.
#[test]
fn a_group_looked_up_by_its_key_equals_its_items_in_the_full_merge() {
    const GROUPS: u64 = 6000;
    let mut model = Model::default();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    // Runs newest first, as parts.
    let mut runs: Vec<Vec<(Vec<u8>, PartMeta)>> = Vec::new();
    for g in 0..GROUPS {
        model.apply(&Op::Create(g));
        for _ in 0..next(16) {
            let user = next(200);
            model.apply(&Op::Join(g, user));
        }
    }
    runs.push(write_run(&model.capture(), 200 << 10));
    for round in 0..6u64 {
        for _ in 0..4000 {
            let (g, u) = (next(GROUPS + 50), next(200));
            let op = match next(10) {
                0 => Op::Delete(g),
                1 => Op::Create(g),
                2 | 3 => Op::Send(g),
                4 | 5 => Op::Join(g, u),
                6 => Op::Leave(g, u),
                _ => Op::Ack(g, u),
            };
            model.apply(&op);
        }
        let delta = model.capture();
        let part_max = if round % 2 == 0 {
            RUN_FILE_BYTES_MIN
        } else {
            200 << 10
        };
        runs.insert(0, write_run(&delta, part_max));
        if round == 3 {
            // The two newest merged into one, as the checkpointer does.
            let newest: Vec<Vec<Item>> = runs.drain(..2).map(|r| read_run(&r).unwrap()).collect();
            runs.insert(0, write_run(&merge(newest, false), 200 << 10));
        }
    }
    let oldest = runs.last().unwrap();
    assert!(oldest.len() > 1, "the oldest run has several parts");
    assert!(
        oldest[0].0.len() > 2 * BLOCK_BYTES_TARGET,
        "its first part has several blocks"
    );
    let slices: Vec<Vec<&[u8]>> = runs
        .iter()
        .map(|r| r.iter().map(|(b, _)| &b[..]).collect())
        .collect();
    let metas: Vec<Vec<PartMeta>> = runs
        .iter()
        .map(|r| r.iter().map(|(_, m)| m.clone()).collect())
        .collect();
    let parts: Vec<&[PartMeta]> = metas.iter().map(|m| &m[..]).collect();
    let expected = model.state();
    let all: Vec<Vec<Item>> = runs.iter().map(|r| read_run(r).unwrap()).collect();
    assert_eq!(merge(all, true), expected, "the full merge is the model");
    for g in 0..GROUPS + 60 {
        let want: Vec<Item> = expected
            .iter()
            .filter(|i| i.key().group == g)
            .cloned()
            .collect();
        let got: Vec<Item> = match super::lazy::items_of_group(&slices, &parts, g).unwrap() {
            None => Vec::new(),
            Some((rec, rows)) => std::iter::once(Item::GroupPut(rec))
                .chain(
                    rows.into_iter()
                        .map(|(user, cursor, join_point, _)| Item::MemberPut {
                            group: g,
                            user,
                            cursor,
                            join_point,
                        }),
                )
                .collect(),
        };
        assert_eq!(got, want, "group {g}");
    }
}
