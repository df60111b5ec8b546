//! Bodies of the wire-protocol fuzz targets.
//!
//! Like `tidemark_engine::fuzz_targets`, they live in the library so that
//! the cargo-fuzz wrappers in `fuzz/` and the corpus replay test
//! (`tests/it/fuzz_corpus.rs`, run by `cargo test`) call the same
//! functions. Each takes arbitrary bytes, must never panic on them, and
//! asserts what its input lets it check. Not an API: hidden from the docs,
//! and compiled only with the `testing` feature (which `fuzz/` and the
//! workspace's tests enable).
//!
//! | target | what it drives |
//! |---|---|
//! | `frame_decoder` | [`FrameDecoder`] over a byte stream in arbitrary chunks |
//! | `request_decode` | [`decode_request`] for every opcode, re-encoded |
//! | `response_decode` | [`decode_response`] for every frame kind, re-encoded |
//! | `records_section` | [`Records`] iteration, against the engine's record check |
//!
//! The decode targets take a whole frame when the input is one (the seed
//! corpus holds the frames of format-spec/vectors/protocol/); any other
//! input is read as `{ selector: u8 | body }` and wrapped in a valid header
//! for the selected opcode, so every body decoder gets arbitrary bodies.

use tidemark_engine::record;

use crate::frame::LENGTH_PREFIX_BYTES;
use crate::{
    decode_request, decode_response, encode_request_in, encode_response_in, Frame, FrameDecoder,
    FrameError, FrameKind, Opcode, Records, RecordsError, FRAME_BYTES_MAX_DEFAULT,
    FRAME_HEADER_BYTES, PROTOCOL_VERSION,
};

/// A fuzz target body: arbitrary bytes in, a panic on a finding.
pub type Target = fn(&[u8]);

/// Every protocol target by name (the name of its `fuzz/fuzz_targets/*.rs`
/// wrapper and of its `fuzz/corpus/` directory).
pub const TARGETS: &[(&str, Target)] = &[
    ("frame_decoder", frame_decoder),
    ("request_decode", request_decode),
    ("response_decode", response_decode),
    ("records_section", records_section),
];

/// Frame length prefix of a frame with `body_len` body bytes.
fn frame_len(body_len: usize) -> u32 {
    // Invariant: fuzz inputs are far below 4 GiB.
    u32::try_from(FRAME_HEADER_BYTES - LENGTH_PREFIX_BYTES + body_len).expect("small input")
}

/// A whole frame: `header` fields, then `body`.
fn build_frame(opcode: u8, request_id: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + body.len());
    out.extend_from_slice(&frame_len(body.len()).to_le_bytes());
    out.push(PROTOCOL_VERSION);
    out.push(opcode);
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// Decodes `bytes` (one whole frame) as whatever its opcode says it is and,
/// if it decodes, checks that it re-encodes to exactly `bytes`: the codec is
/// canonical. Returns whether it decoded.
fn decode_and_check_canonical(bytes: &[u8]) -> bool {
    let Ok(frame) = Frame::parse(bytes) else {
        return false;
    };
    let id = frame.header.request_id;
    let mut out = Vec::new();
    match FrameKind::from_byte(frame.header.opcode) {
        Some(FrameKind::Request(op)) => {
            assert!(
                decode_response(&frame).is_err(),
                "a request decoded as a response"
            );
            let Ok(req) = decode_request(&frame) else {
                return false;
            };
            assert_eq!(req.opcode(), op);
            encode_request_in(frame.header.version, id, &req, &mut out)
                .unwrap_or_else(|e| panic!("a decoded {op:?} request does not encode: {e}"));
        }
        _ => {
            assert!(
                decode_request(&frame).is_err(),
                "a response decoded as a request"
            );
            let Ok(resp) = decode_response(&frame) else {
                return false;
            };
            assert_eq!(resp.kind().byte(), frame.header.opcode);
            encode_response_in(frame.header.version, id, &resp, &mut out)
                .unwrap_or_else(|e| panic!("a decoded {:?} does not encode: {e}", resp.kind()));
            check_records_of(&resp);
        }
    }
    assert_eq!(
        out, bytes,
        "a decoded frame does not re-encode to its bytes"
    );
    true
}

/// The records sections of a decoded response tile their bytes.
fn check_records_of(resp: &crate::Response<'_>) {
    use crate::Response;
    let sections: Vec<Records<'_>> = match resp {
        Response::Pull { records, .. }
        | Response::History { records, .. }
        | Response::Push { records, .. } => vec![*records],
        Response::Sync { groups, .. } => groups.iter().map(|g| g.records).collect(),
        _ => Vec::new(),
    };
    for s in sections {
        let mut n = 0u64;
        for r in s.iter(false) {
            r.expect("decoded sections tile");
            n += 1;
        }
        assert_eq!(n, u64::from(s.count));
    }
}

// ---------------------------------------------------------------------------
// frame_decoder

/// A tiny deterministic generator for chunk sizes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

/// Reads at most `chunk` bytes per call from a slice.
struct Trickle<'a> {
    bytes: &'a [u8],
    chunk: usize,
}

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.chunk).min(self.bytes.len());
        buf[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        Ok(n)
    }
}

/// How the reference splitter says a stream ends.
#[derive(Debug, PartialEq, Eq)]
enum StreamEnd {
    /// Every byte belongs to a whole frame, or `n` bytes of an incomplete
    /// one remain buffered.
    Partial(usize),
    Error(FrameError),
}

/// The frames of `stream` under `max`, split the obvious way.
fn reference_split(stream: &[u8], max: u32) -> (Vec<Vec<u8>>, StreamEnd) {
    let mut frames = Vec::new();
    let mut rest = stream;
    loop {
        let Some(prefix) = rest.first_chunk::<4>() else {
            return (frames, StreamEnd::Partial(rest.len()));
        };
        let len = u32::from_le_bytes(*prefix);
        if len > max {
            let e = FrameError::TooLarge {
                frame_len: len,
                max,
            };
            return (frames, StreamEnd::Error(e));
        }
        if len < frame_len(0) {
            return (
                frames,
                StreamEnd::Error(FrameError::TooShort { frame_len: len }),
            );
        }
        let total = LENGTH_PREFIX_BYTES + len as usize;
        if rest.len() < total {
            return (frames, StreamEnd::Partial(rest.len()));
        }
        frames.push(rest[..total].to_vec());
        rest = &rest[total..];
    }
}

/// Input: `{ limit: u8 | seed: u8 | stream }`. Feeds `stream` to a
/// [`FrameDecoder`] with `frame_bytes_max = 12 + 8 * limit` (255: the
/// default) in chunks chosen by `seed`, through both `push` and `read_from`,
/// taking frames as they complete.
///
/// Checks: the frames and the final state (an error, or the bytes of an
/// incomplete frame still buffered) are those of a plain split of the whole
/// stream, whatever the chunking; the decoder never buffers more than one
/// frame; it always accepts bytes while it holds no whole frame and has no
/// error, and none after an error. Every frame goes through the canonical
/// decode check.
pub fn frame_decoder(data: &[u8]) {
    let [limit, seed, stream @ ..] = data else {
        return;
    };
    let max = if *limit == u8::MAX {
        FRAME_BYTES_MAX_DEFAULT
    } else {
        frame_len(0) + 8 * u32::from(*limit)
    };
    let mut rng = Rng(u64::from(*seed));
    let mut d = FrameDecoder::new(max);
    assert_eq!(d.frame_bytes_max(), max);
    let mut got = Vec::new();
    let mut error = None;
    let mut rest = stream;
    loop {
        loop {
            match d.next_frame() {
                Ok(Some(f)) => got.push(f.to_vec()),
                Ok(None) => break,
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = error {
            assert_eq!(d.error(), Some(e));
            assert_eq!(d.push(&[0; 8]), 0, "a failed decoder accepted bytes");
            assert!(!d.wants_read());
            break;
        }
        if rest.is_empty() {
            break;
        }
        assert!(
            d.wants_read(),
            "the decoder refuses bytes with no frame waiting"
        );
        let chunk = rest.len().min(1 + (rng.next() % 97) as usize);
        let n = if rng.next() & 1 == 0 {
            d.push(&rest[..chunk])
        } else {
            let mut src = Trickle {
                bytes: &rest[..chunk],
                chunk,
            };
            d.read_from(&mut src).expect("reading from a slice")
        };
        assert!(n > 0, "the decoder accepted nothing with no frame waiting");
        rest = &rest[n..];
        assert!(
            d.buffered() <= d.buffer_bytes_max(),
            "more than one frame buffered"
        );
    }
    let (frames, end) = reference_split(stream, max);
    assert_eq!(got, frames, "frames differ from a plain split");
    match end {
        StreamEnd::Error(e) => assert_eq!(error, Some(e)),
        StreamEnd::Partial(n) => {
            assert_eq!(error, None);
            assert_eq!(d.buffered(), n);
        }
    }
    for f in &frames {
        decode_and_check_canonical(f);
    }
}

// ---------------------------------------------------------------------------
// request_decode / response_decode

/// Every opcode byte a response frame may carry.
fn response_opcodes() -> Vec<u8> {
    let mut v: Vec<u8> = Opcode::ALL.iter().map(|op| op.response_byte()).collect();
    v.extend([
        FrameKind::Push.byte(),
        FrameKind::Resync.byte(),
        FrameKind::Error.byte(),
    ]);
    v
}

/// `data` if it is one whole frame, else `{ selector | body }` wrapped in a
/// valid header for `opcodes[selector % len]`.
fn as_frame(data: &[u8], opcodes: &[u8], request_id: impl Fn(u8) -> u64) -> Option<Vec<u8>> {
    if Frame::parse(data).is_ok() {
        return Some(data.to_vec());
    }
    let (&selector, body) = data.split_first()?;
    let opcode = opcodes[selector as usize % opcodes.len()];
    Some(build_frame(opcode, request_id(opcode), body))
}

/// Input: one request frame, or `{ opcode selector: u8 | body }` (see the
/// module docs). Checks that the decoders never panic, that a request never
/// decodes as a response, and that what decodes re-encodes byte for byte.
pub fn request_decode(data: &[u8]) {
    let opcodes: Vec<u8> = Opcode::ALL.iter().map(|op| op.request_byte()).collect();
    if let Some(frame) = as_frame(data, &opcodes, |_| 1) {
        decode_and_check_canonical(&frame);
    }
}

/// Input: one frame the server sends, or `{ kind selector: u8 | body }`
/// (see the module docs). Checks as [`request_decode`], plus that records
/// sections of what decodes tile their bytes.
pub fn response_decode(data: &[u8]) {
    let server_initiated = [FrameKind::Push.byte(), FrameKind::Resync.byte()];
    let request_id = |op: u8| u64::from(!server_initiated.contains(&op));
    if let Some(frame) = as_frame(data, &response_opcodes(), request_id) {
        decode_and_check_canonical(&frame);
    }
}

// ---------------------------------------------------------------------------
// records_section

/// Input: `{ count: u8 | bytes }`: a records section of `bytes` declaring
/// `count` records (255: counted by [`Records::from_bytes`]).
///
/// Checks: the walk yields whole records back to back and stops at its
/// first error; `from_bytes` counts what `iter` accepts; the CRC check only
/// removes records; and every record the engine's own verifier accepts
/// (`tidemark_engine::record`) is accepted by the wire codec at the same
/// offset, with the same fields.
pub fn records_section(data: &[u8]) {
    let Some((&count, bytes)) = data.split_first() else {
        return;
    };
    let declared = if count == u8::MAX {
        match Records::from_bytes(bytes) {
            Ok(r) => {
                assert_eq!(r.bytes, bytes);
                r.count
            }
            Err(_) => u32::MAX,
        }
    } else {
        u32::from(count)
    };
    let section = Records {
        count: declared,
        bytes,
    };
    let mut lens = Vec::new();
    for verify in [false, true] {
        let mut pos = 0;
        let mut failed = None;
        let mut ok = Vec::new();
        for r in section.iter(verify) {
            assert!(failed.is_none(), "the records walk went on after an error");
            match r {
                Ok(v) => {
                    let b = v.bytes();
                    assert!(b.len() >= record::RECORD_HEADER_BYTES);
                    assert_eq!(b, &bytes[pos..pos + b.len()]);
                    assert_eq!(
                        u32::from_le_bytes(*b.first_chunk().unwrap()) as usize,
                        b.len()
                    );
                    assert_eq!(v.payload().len(), b.len() - record::RECORD_HEADER_BYTES);
                    let _ = (v.crc32(), v.msg_id(), v.timestamp_ms(), v.sender_id());
                    let _ = (v.client_msg_id(), v.kind(), v.flags());
                    pos += b.len();
                    ok.push(b.len());
                }
                Err(e) => failed = Some(e),
            }
        }
        match failed {
            None => {
                assert_eq!(pos, bytes.len(), "the walk ended early without an error");
                if declared != u32::MAX {
                    assert_eq!(ok.len() as u64, u64::from(declared));
                }
            }
            Some(RecordsError::CountMismatch { declared: d, found }) => {
                assert_eq!(d, declared);
                assert_ne!(found, declared);
            }
            Some(_) => assert!(pos < bytes.len()),
        }
        if verify {
            assert!(ok.len() <= lens.len() && ok[..] == lens[..ok.len()]);
        } else {
            lens = ok;
        }
    }
    // Version 1 accepts a subset of what version 2 does (kind 0, flags 0),
    // record for record.
    let mut v2 = section.iter(false);
    for r in section.iter_in(1, false) {
        let Ok(r) = r else { break };
        assert_eq!(
            (r.kind(), r.flags()),
            (0, 0),
            "version 1 took a kind or flag"
        );
        match v2.next() {
            Some(Ok(v)) => assert_eq!(v.bytes(), r.bytes()),
            other => panic!("version 2 refuses what version 1 accepts: {other:?}"),
        }
    }
    // The engine's verifier is as strict (kind, flags, reserved bytes) or
    // stricter, never looser: what it accepts, the wire codec accepts, with
    // the same fields (version 2's codec: it carries every stored kind).
    let unchecked = Records {
        count: u32::MAX,
        bytes,
    };
    let mut wire = unchecked.iter(true);
    for r in record::RecordIter::new(bytes, record::RECORD_BYTES_STORED_MAX) {
        let Ok(r) = r else { break };
        let v = match wire.next() {
            Some(Ok(v)) => v,
            other => panic!("the engine accepts a record the wire codec refuses: {other:?}"),
        };
        assert_eq!(v.bytes(), r.bytes);
        let h = r.header;
        assert_eq!(
            (v.crc32(), v.msg_id(), v.timestamp_ms(), v.sender_id()),
            (h.crc, h.msg_id, h.timestamp_ms, h.sender_id)
        );
        assert_eq!(
            (v.client_msg_id(), v.kind(), v.flags()),
            (h.client_msg_id, h.kind, h.flags)
        );
        assert_eq!(v.payload(), r.payload());
    }
}

// ---------------------------------------------------------------------------
// Seeds

/// The seed corpus of every protocol target as `(target, file name, bytes)`,
/// from the protocol vectors (`(file stem, bytes)` of
/// format-spec/vectors/protocol/) and records the engine encodes.
pub fn seeds(protocol_vectors: &[(String, Vec<u8>)]) -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out: Vec<(&'static str, String, Vec<u8>)> = Vec::new();
    for (name, v) in protocol_vectors {
        let seed = format!("vector-{name}");
        let target = match v.get(5).and_then(|&op| FrameKind::from_byte(op)) {
            Some(FrameKind::Request(_)) => "request_decode",
            _ => "response_decode",
        };
        out.push((target, seed.clone(), v.clone()));
        // One frame through the stream decoder, under the default limit.
        out.push(("frame_decoder", seed, [&[u8::MAX, 7][..], v].concat()));
    }
    let all: Vec<u8> = protocol_vectors
        .iter()
        .flat_map(|(_, v)| v.clone())
        .collect();
    out.push((
        "frame_decoder",
        "all-vectors".into(),
        [&[u8::MAX, 1][..], &all].concat(),
    ));
    out.push((
        "frame_decoder",
        "all-vectors-limit-44".into(),
        [&[4, 2][..], &all].concat(),
    ));
    // Records as the engine writes them: a section of three, one with a
    // flipped payload bit, one cut short.
    let mut section = Vec::new();
    for (id, payload) in [(1u64, &b"hello"[..]), (2, b""), (3, &[7u8; 100][..])] {
        record::encode_into(
            &record::NewRecord {
                msg_id: id,
                timestamp_ms: 1_700_000_000_000,
                sender_id: 42,
                client_msg_id: id * 3,
                payload,
            },
            &mut section,
        );
    }
    out.push((
        "records_section",
        "three".into(),
        [&[3][..], &section].concat(),
    ));
    out.push((
        "records_section",
        "counted".into(),
        [&[u8::MAX][..], &section].concat(),
    ));
    let mut flipped = section.clone();
    flipped[50] ^= 4;
    out.push((
        "records_section",
        "bad-crc".into(),
        [&[3][..], &flipped].concat(),
    ));
    let cut = &section[..section.len() - 9];
    out.push((
        "records_section",
        "truncated".into(),
        [&[3][..], cut].concat(),
    ));
    out
}
