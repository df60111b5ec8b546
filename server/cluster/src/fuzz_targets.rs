//! Bodies of the replication fuzz targets: the places where bytes from
//! another node or from the disk enter a replica (format-spec/cluster.md
//! sections 3, 7, 7.1 and 8.2).
//!
//! Like `tidemark_engine::fuzz_targets`, they live in the library so that
//! the cargo-fuzz wrappers in `fuzz/` and the corpus replay test
//! (`tests/it/fuzz_corpus.rs`, run by `cargo test`) call the same
//! functions. Each takes arbitrary bytes, must never panic on them, and
//! asserts what its input lets it check. Compiled only with the `testing`
//! feature.
//!
//! | target | what it drives | what it checks |
//! |---|---|---|
//! | `raft_frame` | [`tcp::FrameReader`] (the bytes arriving one at a time), [`tcp::decode_frame`] | the reader's buffer never holds more than what arrived (plus one read); a decoded message re-encodes to a frame that decodes to the same Raft content (type, ids, terms, indexes, entries, snapshot metadata, reject) |
//! | `peer_handshake` | [`peer_auth`]'s decoders, [`peer_auth::verify`] | a message that decodes re-encodes to its bytes; a refused one names its first wrong header byte; a proof verifies only if it is the one [`peer_auth::prove`] makes |
//! | `raft_log_open` | [`RaftLog::open`] on a file of arbitrary bytes | a refused file is left byte for byte; an opened log is contiguous from its start, a version 3 file is only cut and never below a synced length its header or a valid record names, and the log opens again to the same state |
//! | `snapshot_stream` | [`snapshot::receive`] | nothing is written outside the staging directory; a refused stream leaves nothing staged; an accepted one is the `MsgSnapshot` to this node at its Begin's (index, term) |
//!
//! Every record of these formats carries a CRC, which random bytes almost
//! never match. So each target reads its input's first byte as a mode: bit
//! 0 clear, the rest is used as it is (the seeds: real frames, logs and
//! streams); bit 0 set, the rest is a list of `{ kind: u8 | n: u8 | n
//! bytes }` pieces, each encoded as a record (or frame) with a correct
//! length and CRC, so the fuzzer reaches the decoders behind the checks.

use protobuf::Message as _;
use raft::eraftpb::{Entry, HardState, Message, MessageType};
use tidemark_engine::fuzz_targets::ScratchDir;

use crate::members::KnownPeers;
use crate::peer_auth;
use crate::raft_log::{self, encode_record, RaftLog};
use crate::raft_log_format;
use crate::snapshot;
use crate::tcp;

/// A fuzz target body: arbitrary bytes in, a panic on a finding.
pub type Target = fn(&[u8]);

/// Every replication target by name (its `fuzz/fuzz_targets/*.rs` wrapper
/// and its `fuzz/corpus/` directory).
pub const TARGETS: &[(&str, Target)] = &[
    ("raft_frame", raft_frame),
    ("peer_handshake", peer_handshake),
    ("raft_log_open", raft_log_open),
    ("snapshot_stream", snapshot_stream),
];

/// The node a fuzzed stream is received by, and the replica set.
const ME: u64 = 2;
const VOTERS: [u64; 3] = [1, 2, 3];

/// The input's mode byte and the rest (module docs).
fn split(data: &[u8]) -> Option<(bool, &[u8])> {
    let (&mode, rest) = data.split_first()?;
    Some((mode & 1 == 1, rest))
}

/// `{ kind | n | n bytes }` pieces of `rest`; the last one takes what is
/// left when fewer than `n` bytes remain.
fn pieces(mut rest: &[u8]) -> Vec<(u8, &[u8])> {
    let mut out = Vec::new();
    while let [kind, n, tail @ ..] = rest {
        let n = (*n as usize).min(tail.len());
        out.push((*kind, &tail[..n]));
        rest = &tail[n..];
    }
    out
}

/// Records with correct lengths and CRCs, one per piece (kinds as given).
fn records_of(rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for (kind, body) in pieces(rest) {
        encode_record(&mut out, kind, |b| b.extend_from_slice(body));
    }
    out
}

/// [`tcp::decode_frame`] on one frame: raw, or built from `{ from: u8 |
/// to: u8 | protobuf bytes }` with a correct length and CRC.
pub fn raft_frame(data: &[u8]) {
    let Some((built, rest)) = split(data) else {
        return;
    };
    let frame = if built {
        let [from, to, body @ ..] = rest else {
            return;
        };
        let mut f = vec![0u8; 8];
        f.extend_from_slice(&u64::from(*from).to_le_bytes());
        f.extend_from_slice(&u64::from(*to).to_le_bytes());
        f.extend_from_slice(body);
        let len = u32::try_from(f.len() - 4).unwrap_or(u32::MAX);
        f[..4].copy_from_slice(&len.to_le_bytes());
        let crc = crc32fast::hash(&f[8..]);
        f[4..8].copy_from_slice(&crc.to_le_bytes());
        f
    } else {
        rest.to_vec()
    };
    if let Some(head) = frame.get(..4).and_then(|h| <[u8; 4]>::try_from(h).ok()) {
        let _ = tcp::frame_len(head, tcp::FRAME_BYTES_MAX_DEFAULT);
    }
    // The reader, fed one byte per read: what it buffers follows what
    // arrived, whatever the length claims.
    let mut reader = tcp::FrameReader::new(tcp::FRAME_BYTES_MAX_DEFAULT);
    let mut bytes = OneByte(&frame);
    let mut arrived = 0;
    while let Ok(tcp::Step::Pending | tcp::Step::Frame) = reader.read_from(&mut bytes) {
        arrived += 1;
        assert!(
            reader.buffer_capacity() <= 2 * arrived + tcp::READ_CHUNK_BYTES,
            "{} bytes buffered for {arrived} arrived",
            reader.buffer_capacity()
        );
        if !reader.frame().is_empty() {
            assert_eq!(reader.frame(), &frame[..reader.frame().len()]);
        }
    }
    let Ok(msg) = tcp::decode_frame(&frame) else {
        return;
    };
    // A decoded message re-encodes to a frame that decodes to the same
    // Raft content. (Not to the input's bytes, nor to an equal message:
    // rust-protobuf keeps an arbitrary input's unknown fields in a hash
    // map, which re-encodes them in another order; raft-rs never reads
    // them.)
    let mut again = Vec::new();
    tcp::encode_frame(&mut again, &msg);
    let back = tcp::decode_frame(&again).expect("a frame this code encoded decodes");
    assert_eq!(
        raft_content(&back),
        raft_content(&msg),
        "a re-encoding changed the message"
    );
}

/// Hands out one byte per read.
struct OneByte<'a>(&'a [u8]);

impl std::io::Read for OneByte<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match (self.0.split_first(), buf.first_mut()) {
            (Some((&b, rest)), Some(out)) => {
                *out = b;
                self.0 = rest;
                Ok(1)
            }
            _ => Ok(0),
        }
    }
}

/// The secret the handshake target proves with.
const FUZZ_SECRET: &[u8] = b"an example cluster secret";

/// [`peer_auth`]'s three messages on the input: raw, or (built mode) the
/// input's second byte picks the kind and a correct header is put before
/// the rest, so that the fuzzer reaches the fields.
pub fn peer_handshake(data: &[u8]) {
    let Some((built, rest)) = split(data) else {
        return;
    };
    let bytes = match (built, rest.split_first()) {
        (true, Some((kind, tail))) => {
            let mut b = peer_auth::MAGIC.to_vec();
            b.push(peer_auth::VERSION);
            b.push(1 + kind % 3);
            b.extend_from_slice(tail);
            b
        }
        (true, None) => return,
        (false, _) => rest.to_vec(),
    };
    // Any prefix: refused exactly at its first wrong header byte.
    for kind in [
        peer_auth::KIND_HELLO,
        peer_auth::KIND_CHALLENGE,
        peer_auth::KIND_PROOF,
    ] {
        let prefix = &bytes[..bytes.len().min(peer_auth::HEADER_BYTES)];
        if let Err(peer_auth::HandshakeError::Header { offset, .. }) =
            peer_auth::check_header(kind, prefix)
        {
            assert!(peer_auth::check_header(kind, &prefix[..offset]).is_ok());
        }
    }
    let secret = peer_auth::ClusterSecret::new(FUZZ_SECRET.to_vec()).expect("a long secret");
    let hello = bytes
        .get(..peer_auth::HELLO_BYTES)
        .and_then(|b| <[u8; peer_auth::HELLO_BYTES]>::try_from(b).ok())
        .and_then(|b| Some((b, peer_auth::decode_hello(&b).ok()?)));
    if let Some((b, hello)) = &hello {
        assert_eq!(&peer_auth::encode_hello(hello), b);
        // The rest, read as the listener's nonce and the dialer's proof.
        let tail = &bytes[peer_auth::HELLO_BYTES..];
        let nonce = tail.get(..32).and_then(|n| <[u8; 32]>::try_from(n).ok());
        let mac = tail.get(32..64).and_then(|m| <[u8; 32]>::try_from(m).ok());
        if let (Some(nonce), Some(mac)) = (nonce, mac) {
            let ok = peer_auth::verify(&secret, peer_auth::KIND_PROOF, hello, &nonce, &mac);
            let made = peer_auth::prove(&secret, peer_auth::KIND_PROOF, hello, &nonce);
            assert_eq!(ok.is_ok(), made == mac, "verify and prove disagree");
        }
    }
    if let Some(b) = bytes
        .get(..peer_auth::CHALLENGE_BYTES)
        .and_then(|b| <[u8; peer_auth::CHALLENGE_BYTES]>::try_from(b).ok())
    {
        if let Ok(c) = peer_auth::decode_challenge(&b) {
            assert_eq!(peer_auth::encode_challenge(&c), b);
        }
    }
    if let Some(b) = bytes
        .get(..peer_auth::PROOF_BYTES)
        .and_then(|b| <[u8; peer_auth::PROOF_BYTES]>::try_from(b).ok())
    {
        if let Ok(mac) = peer_auth::decode_proof(&b) {
            assert_eq!(peer_auth::encode_proof(&mac), b);
        }
    }
}

/// What raft-rs reads of a message: every field it acts on.
type RaftContent = (
    i32,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    Vec<(u64, u64, i32, Vec<u8>)>,
    (u64, u64, Vec<u8>),
    bool,
    u64,
);

fn raft_content(m: &Message) -> RaftContent {
    let meta = m.get_snapshot().get_metadata();
    (
        m.get_msg_type() as i32,
        m.from,
        m.to,
        m.term,
        m.log_term,
        m.index,
        m.commit,
        m.get_entries()
            .iter()
            .map(|e| (e.index, e.term, e.get_entry_type() as i32, e.data.to_vec()))
            .collect(),
        (meta.index, meta.term, m.get_snapshot().data.to_vec()),
        m.reject,
        m.reject_hint,
    )
}

/// The key of a built log file (`raft_log_open`, bit 0 of the mode).
const BUILT_KEY: u32 = 0x0403_0201;

/// [`RaftLog::open`] on a `raft/log` of the input's bytes: raw, or a
/// version 3 header (key [`BUILT_KEY`], `durable_len` 32) and records built
/// from pieces (kinds as given, so unknown ones too), each naming its own
/// offset as its synced length (mode bit 1 clear: every byte before it
/// synced) or 32 (set: none).
pub fn raft_log_open(data: &[u8]) {
    let Some((built, rest)) = split(data) else {
        return;
    };
    let bytes = if built {
        let vouch = data[0] & 2 == 0;
        let mut b = raft_log_format::encode_header(BUILT_KEY, 32).to_vec();
        for (kind, body) in pieces(rest) {
            let synced = if vouch { b.len() as u64 } else { 32 };
            raft_log_format::encode_record_v3(&mut b, BUILT_KEY, synced, kind, |r| {
                r.extend_from_slice(body)
            });
        }
        b
    } else {
        rest.to_vec()
    };
    let scratch = ScratchDir::new("raft-log");
    let dir = scratch.path().join("raft");
    std::fs::create_dir_all(&dir).expect("create the raft directory");
    let path = dir.join(raft_log::FILE_NAME);
    std::fs::write(&path, &bytes).expect("write the log file");
    let log = match RaftLog::open(&dir, &VOTERS) {
        Ok(log) => log,
        Err(_) => {
            // A refused file is left as it was: nothing cut, nothing
            // rewritten.
            let after = std::fs::read(&path).expect("read the log file");
            assert!(after == bytes, "a refused open changed the file");
            return;
        }
    };
    let (start, last) = (log.start(), log.last());
    assert!(last >= start.0, "last {last} below the start {start:?}");
    for i in start.0 + 1..=last {
        let e = log
            .entry(i)
            .unwrap_or_else(|| panic!("entry {i} missing in {start:?}..={last}"));
        assert_eq!(e.index, i, "entry {i} holds index {}", e.index);
    }
    let reading = raft_log_format::read(&bytes);
    if let Some(h) = reading
        .header
        .filter(|h| h.version == raft_log_format::VERSION)
    {
        // A version 3 file is only cut, and never below a length that its
        // header or any valid record header in it says was synced.
        let after = std::fs::read(&path).expect("read the log file");
        assert!(
            bytes.starts_with(&after),
            "an open rewrote a version 3 file"
        );
        let proof = raft_log_format::furthest_proof(&bytes, h.bytes, h.mark_key)
            .map_or(0, |(synced, _)| synced)
            .max(h.durable_len);
        assert!(
            after.len() as u64 >= proof,
            "cut to {} bytes, but {proof} were synced",
            after.len()
        );
    }
    let state = (start, last, log.hard_state().clone(), log.file_bytes());
    drop(log);
    // What open kept (a torn tail cut, an older version rewritten) opens
    // again to the same log.
    let again = RaftLog::open(&dir, &VOTERS).expect("a log this code opened opens again");
    assert_eq!(
        (
            again.start(),
            again.last(),
            again.hard_state().clone(),
            again.file_bytes()
        ),
        state,
        "a reopened log differs"
    );
}

/// [`snapshot::receive`] by node 2 of {1, 2, 3}: raw stream bytes (after
/// the preamble), or records built from pieces.
pub fn snapshot_stream(data: &[u8]) {
    let Some((built, rest)) = split(data) else {
        return;
    };
    let bytes = if built {
        records_of(rest)
    } else {
        rest.to_vec()
    };
    let scratch = ScratchDir::new("snapshot-stream");
    let dir = scratch.path();
    let inbox = snapshot::Inbox::new(dir, 0, 0);
    let result = snapshot::receive(
        &mut &bytes[..],
        &inbox,
        ME,
        &KnownPeers::new(VOTERS.to_vec()),
    );
    let inbox = dir.join(snapshot::INBOX_DIR);
    let mut staged = Vec::new();
    for entry in std::fs::read_dir(dir).expect("list the replica directory") {
        let name = entry.expect("an entry").file_name();
        assert_eq!(
            name.to_str(),
            Some(snapshot::INBOX_DIR),
            "a stream wrote {name:?} outside {}",
            snapshot::INBOX_DIR
        );
    }
    if let Ok(list) = std::fs::read_dir(&inbox) {
        for entry in list {
            staged.push(
                entry
                    .expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    match result {
        Err(_) => assert!(
            staged.is_empty(),
            "a refused stream left {staged:?} in {}",
            snapshot::INBOX_DIR
        ),
        Ok(msg) => {
            assert_eq!(msg.get_msg_type(), MessageType::MsgSnapshot);
            assert_eq!(msg.to, ME, "accepted a snapshot for another node");
            assert!(VOTERS.contains(&msg.from), "accepted one from a non-voter");
            let meta = msg.get_snapshot().get_metadata();
            let name = format!("{}-{}", meta.index, meta.term);
            assert_eq!(staged, [name], "an accepted stream's staging");
        }
    }
}

/// Seeds for the three targets (raw mode): real frames, a real Raft log
/// with a compaction start, entries and a hard state, and a whole
/// snapshot stream of two files.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    let raw = |b: &[u8]| [&[0u8][..], b].concat();
    for (name, msg) in seed_messages() {
        let mut frame = Vec::new();
        tcp::encode_frame(&mut frame, &msg);
        out.push(("raft_frame", format!("frame-{name}"), raw(&frame)));
    }
    for (name, bytes) in seed_handshakes() {
        out.push(("peer_handshake", name.into(), raw(&bytes)));
    }
    out.push(("raft_log_open", "log-compacted".into(), raw(&seed_log())));
    out.push((
        "raft_log_open",
        "log-three-writes".into(),
        raw(&seed_log_v3()),
    ));
    out.push((
        "snapshot_stream",
        "stream-two-files".into(),
        raw(&seed_stream()),
    ));
    out
}

/// cluster.md section 7.1's vectors: a Hello followed by the listener's
/// nonce and the dialer's valid proof, the Challenge, the Proof.
fn seed_handshakes() -> Vec<(&'static str, Vec<u8>)> {
    let secret = peer_auth::ClusterSecret::new(FUZZ_SECRET.to_vec()).expect("a long secret");
    let hello = peer_auth::Hello {
        dialer: 1,
        listener: 2,
        nonce: [0x11; 32],
    };
    let nonce = [0x22; 32];
    let challenge = peer_auth::Challenge {
        nonce,
        mac: peer_auth::prove(&secret, peer_auth::KIND_CHALLENGE, &hello, &nonce),
    };
    let proof = peer_auth::prove(&secret, peer_auth::KIND_PROOF, &hello, &nonce);
    vec![
        (
            "hello-and-proof",
            [&peer_auth::encode_hello(&hello)[..], &nonce, &proof].concat(),
        ),
        (
            "challenge",
            peer_auth::encode_challenge(&challenge).to_vec(),
        ),
        ("proof", peer_auth::encode_proof(&proof).to_vec()),
    ]
}

fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
    Entry {
        index,
        term,
        data: data.to_vec().into(),
        ..Default::default()
    }
}

fn seed_messages() -> Vec<(&'static str, Message)> {
    let append = Message {
        msg_type: MessageType::MsgAppend,
        from: 1,
        to: 2,
        term: 3,
        log_term: 3,
        index: 7,
        commit: 7,
        entries: vec![entry(8, 3, b"round"), entry(9, 3, b"")].into(),
        ..Default::default()
    };
    let heartbeat = Message {
        msg_type: MessageType::MsgHeartbeat,
        from: 1,
        to: 3,
        term: 3,
        commit: 9,
        ..Default::default()
    };
    vec![("append", append), ("heartbeat", heartbeat)]
}

/// A version 2 log (read, then rewritten as version 3) with a
/// compaction start, entries and a hard state.
fn seed_log() -> Vec<u8> {
    let mut b = raft_log::MAGIC.to_vec();
    b.extend_from_slice(&raft_log::VERSION_2.to_le_bytes());
    b.extend_from_slice(&[0; 4]);
    encode_record(&mut b, raft_log::KIND_START, |r| {
        raft_log_format::start_body(r, 4, 2)
    });
    for e in [entry(5, 2, b"a round"), entry(6, 3, b"")] {
        encode_record(&mut b, raft_log::KIND_ENTRY, |r| {
            raft_log_format::entry_body(r, &e)
        });
    }
    let hs = HardState {
        term: 3,
        vote: 1,
        commit: 6,
        ..Default::default()
    };
    encode_record(&mut b, raft_log::KIND_HARD_STATE, |r| {
        raft_log_format::hard_state_body(r, &hs)
    });
    b
}

/// A version 3 log as a compaction and two writes leave it (key
/// [`BUILT_KEY`]): start (4, 2), entries 5 and 6, then entry 7 and a hard
/// state, each write naming the synced length before it.
fn seed_log_v3() -> Vec<u8> {
    let hs = |term, vote, commit| HardState {
        term,
        vote,
        commit,
        ..Default::default()
    };
    let mut b = raft_log_format::encode_whole(
        BUILT_KEY,
        (4, 2),
        None,
        &[entry(5, 2, b"a round"), entry(6, 3, b"")],
        &hs(3, 1, 5),
    );
    let writes: [(Option<Entry>, HardState); 2] = [
        (Some(entry(7, 3, b"next")), hs(3, 1, 6)),
        (None, hs(4, 2, 7)),
    ];
    for (e, hs) in writes {
        let synced = b.len() as u64;
        if let Some(e) = e {
            raft_log_format::encode_record_v3(
                &mut b,
                BUILT_KEY,
                synced,
                raft_log::KIND_ENTRY,
                |r| raft_log_format::entry_body(r, &e),
            );
        }
        raft_log_format::encode_record_v3(
            &mut b,
            BUILT_KEY,
            synced,
            raft_log::KIND_HARD_STATE,
            |r| raft_log_format::hard_state_body(r, &hs),
        );
    }
    b
}

fn seed_stream() -> Vec<u8> {
    let (index, term, last_round) = (40, 3, 7);
    let mut b = Vec::new();
    snapshot::encode_begin(&mut b, [1, ME, index, term, last_round, 12]);
    for (name, data) in [
        ("FORMAT", &b"hello"[..]),
        ("groups/1/00000001.seg", b"segment"),
    ] {
        snapshot::encode_file(&mut b, name, data.len() as u64).expect("a short name");
        encode_record(&mut b, snapshot::KIND_CHUNK, |r| r.extend_from_slice(data));
    }
    let mut msg = Message {
        msg_type: MessageType::MsgSnapshot,
        from: 1,
        to: ME,
        term,
        ..Default::default()
    };
    let meta = msg.mut_snapshot().mut_metadata();
    meta.index = index;
    meta.term = term;
    msg.mut_snapshot().data = snapshot::descriptor(last_round).into();
    let body = msg.write_to_bytes().expect("a message encodes");
    encode_record(&mut b, snapshot::KIND_END, |r| {
        r.extend_from_slice(&2u32.to_le_bytes());
        r.extend_from_slice(&[0; 4]);
        r.extend_from_slice(&12u64.to_le_bytes());
        r.extend_from_slice(&body);
    });
    b
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// The seeds reach the end of each decoder: accepted, not refused.
    #[test]
    fn the_seeds_are_accepted_whole() {
        for (name, msg) in seed_messages() {
            let mut frame = Vec::new();
            tcp::encode_frame(&mut frame, &msg);
            assert_eq!(tcp::decode_frame(&frame).expect(name), msg);
        }
        let scratch = ScratchDir::new("seed-log");
        let dir: &Path = scratch.path();
        std::fs::write(dir.join(raft_log::FILE_NAME), seed_log()).unwrap();
        let log = RaftLog::open(dir, &VOTERS).expect("the seed log opens");
        assert_eq!((log.start(), log.last()), ((4, 2), 6));
        assert_eq!(log.hard_state().commit, 6);
        drop(log);
        std::fs::write(dir.join(raft_log::FILE_NAME), seed_log_v3()).unwrap();
        let log = RaftLog::open(dir, &VOTERS).expect("the version 3 seed log opens");
        assert_eq!((log.start(), log.last()), ((4, 2), 7));
        assert_eq!(log.hard_state().commit, 7);
        assert_eq!(log.file_bytes(), seed_log_v3().len() as u64);
        let scratch = ScratchDir::new("seed-stream");
        let msg = snapshot::receive(
            &mut &seed_stream()[..],
            &snapshot::Inbox::new(scratch.path(), 0, 0),
            ME,
            &KnownPeers::new(VOTERS.to_vec()),
        )
        .expect("the seed stream is accepted");
        assert_eq!(msg.get_snapshot().get_metadata().index, 40);
        let staged = scratch.path().join(snapshot::INBOX_DIR).join("40-3");
        assert_eq!(
            std::fs::read(staged.join("groups/1/00000001.seg")).unwrap(),
            b"segment"
        );
        for (_, _, seed) in seeds() {
            for (_, target) in TARGETS {
                target(&seed);
            }
        }
    }

    /// Built mode reaches past the CRCs: a stream built from pieces is
    /// decoded as far as its records go; a built log's records are valid.
    #[test]
    fn built_mode_makes_records_with_valid_crcs() {
        let recs = records_of(&[3, 2, 0xAA, 0xBB, 9, 0]);
        // A hard state of zeros, then entry 1 of term 1 (no data).
        let entry_1 = [&1u64.to_le_bytes()[..], &1u64.to_le_bytes(), &[0; 8]].concat();
        let log_mode = [&[1u8][..], &[2, 24], &[0; 24], &[1, 24], &entry_1].concat();
        raft_log_open(&log_mode);
        let scratch = ScratchDir::new("built-log");
        let dir: &Path = scratch.path();
        let mut b = raft_log_format::encode_header(BUILT_KEY, 32).to_vec();
        for (kind, body) in pieces(&log_mode[1..]) {
            let synced = b.len() as u64;
            raft_log_format::encode_record_v3(&mut b, BUILT_KEY, synced, kind, |r| {
                r.extend_from_slice(body)
            });
        }
        std::fs::write(dir.join(raft_log::FILE_NAME), &b).unwrap();
        let log = RaftLog::open(dir, &VOTERS).expect("the built log opens");
        assert_eq!(log.last(), 1);
        assert_eq!(log.hard_state().term, 0);
        assert_eq!(recs.len(), 2 * raft_log::RECORD_HEADER_BYTES + 2);
        assert_eq!(recs[8], 3);
        let crc = u32::from_le_bytes([recs[4], recs[5], recs[6], recs[7]]);
        assert_eq!(crc, crc32fast::hash(&recs[8..18]));
    }
}
