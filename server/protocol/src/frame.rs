//! Framing (format-spec/protocol.md "Framing"): the length prefix, the
//! fixed header, and a sans-IO decoder that turns a byte stream into whole
//! frames with bounded memory.
//!
//! Format: `{ frame_len: u32 | version: u8 | opcode: u8 | flags: u16 |
//!            request_id: u64 | body: [u8; frame_len - 12] }`, little-endian.

use std::fmt;
use std::io;

use super::error_code::ErrorCode;
use super::wire::{put_u16, put_u32, put_u64, put_u8, DecodeError, EncodeError, Reader};

/// Bytes of the `frame_len` prefix.
pub const LENGTH_PREFIX_BYTES: usize = 4;
/// Bytes of the whole fixed header, length prefix included.
pub const FRAME_HEADER_BYTES: usize = 16;
/// Smallest valid `frame_len`: the header after the prefix, empty body.
pub const FRAME_LEN_MIN: u32 = (FRAME_HEADER_BYTES - LENGTH_PREFIX_BYTES) as u32;
/// Default of the node's `frame_bytes_max` (limit on `frame_len`).
pub const FRAME_BYTES_MAX_DEFAULT: u32 = 4 << 20;
/// No node may set `frame_bytes_max` below this, so the handshake frames a
/// client sends before it knows the limit always fit.
pub const FRAME_BYTES_MAX_FLOOR: u32 = 4096;
/// The decoder grows its buffer by at most this much per read when it does
/// not yet know it needs more, so an idle connection holds little memory.
pub const READ_CHUNK_BYTES: usize = 16 * 1024;

/// The fixed header of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Bytes after the length prefix: 12 + body length.
    pub frame_len: u32,
    pub version: u8,
    pub opcode: u8,
    /// Must be 0 in version 1.
    pub flags: u16,
    /// Chosen by the client, echoed by the response; 0 on PUSH and RESYNC.
    pub request_id: u64,
}

impl FrameHeader {
    /// Appends the 16 header bytes, the inverse of `parse`.
    fn put(&self, out: &mut Vec<u8>) {
        // Format: { frame_len: u32 | version: u8 | opcode: u8 | flags: u16 | request_id: u64 }
        put_u32(out, self.frame_len);
        put_u8(out, self.version);
        put_u8(out, self.opcode);
        put_u16(out, self.flags);
        put_u64(out, self.request_id);
    }

    /// Parses the 16 header bytes at the start of `buf`.
    fn parse(buf: &[u8]) -> Result<FrameHeader, DecodeError> {
        let mut r = Reader::new(buf, 0);
        Ok(FrameHeader {
            frame_len: r.u32("frame_len")?,
            version: r.u8("version")?,
            opcode: r.u8("opcode")?,
            flags: r.u16("flags")?,
            request_id: r.u64("request_id")?,
        })
    }
}

/// A whole frame: its header and its body, borrowed from the input buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    pub header: FrameHeader,
    pub body: &'a [u8],
}

impl<'a> Frame<'a> {
    /// Parses a buffer that holds exactly one frame (a test vector, or a
    /// frame a client framed itself).
    pub fn parse(bytes: &'a [u8]) -> Result<Frame<'a>, DecodeError> {
        let header = FrameHeader::parse(bytes)?;
        let have = bytes.len() - LENGTH_PREFIX_BYTES;
        if header.frame_len < FRAME_LEN_MIN || header.frame_len as usize != have {
            return Err(DecodeError::BadFrameLength {
                frame_len: header.frame_len,
                have,
            });
        }
        Ok(Frame {
            header,
            body: bytes.get(FRAME_HEADER_BYTES..).unwrap_or(&[]),
        })
    }

    /// The frame's bytes as they were on the wire: length prefix, header,
    /// body (what a caller keeps beyond the decoder's buffer).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + self.body.len());
        self.header.put(&mut out);
        out.extend_from_slice(self.body);
        out
    }
}

/// Appends a frame header with a placeholder length; returns the frame's
/// start in `out` for [`finish_frame`].
pub(crate) fn begin_frame(out: &mut Vec<u8>, version: u8, opcode: u8, request_id: u64) -> usize {
    let start = out.len();
    FrameHeader {
        frame_len: 0, // set by finish_frame
        version,
        opcode,
        flags: 0, // none defined in version 1
        request_id,
    }
    .put(out);
    start
}

/// Sets the length prefix of the frame begun at `start`: the bytes written
/// after the prefix plus `trailing_bytes` the caller writes after `out`.
pub(crate) fn finish_frame(
    out: &mut [u8],
    start: usize,
    trailing_bytes: u64,
) -> Result<(), EncodeError> {
    let written = (out.len() - start - LENGTH_PREFIX_BYTES) as u64;
    let frame_len = written.saturating_add(trailing_bytes);
    let len = u32::try_from(frame_len).map_err(|_| EncodeError::FrameTooLarge { frame_len })?;
    out[start..start + LENGTH_PREFIX_BYTES].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

/// Why the byte stream cannot be split into frames. Both are fatal: the
/// server answers with an ERROR frame of request id 0 and closes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// A length prefix above `frame_bytes_max`, seen from its 4 bytes alone.
    TooLarge { frame_len: u32, max: u32 },
    /// A length prefix below 12, too short for the header.
    TooShort { frame_len: u32 },
}

impl FrameError {
    /// The wire error code the server answers this with.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            FrameError::TooLarge { .. } => ErrorCode::FrameTooLarge,
            FrameError::TooShort { .. } => ErrorCode::BadFrame,
        }
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::TooLarge { frame_len, max } => {
                write!(f, "frame length {frame_len} exceeds the limit of {max}")
            }
            FrameError::TooShort { frame_len } => {
                write!(
                    f,
                    "frame length {frame_len} is below the minimum of {FRAME_LEN_MIN}"
                )
            }
        }
    }
}

impl std::error::Error for FrameError {}

/// Splits a byte stream into frames, sans IO: the caller puts bytes in
/// (`push`, or `spare_mut` + `commit` to read straight into the buffer) and
/// takes whole frames out with `next_frame`.
///
/// Memory is bounded whatever arrives: the buffer never holds more than
/// `4 + frame_bytes_max` bytes, grows only as a frame's bytes arrive, and a
/// length prefix above the limit is rejected from its 4 bytes, before any of
/// the body is buffered. After an error the decoder accepts nothing more.
#[derive(Debug)]
pub struct FrameDecoder {
    /// Initialised storage; `buf.len()` is the allocation in use.
    buf: Vec<u8>,
    /// First byte not yet returned as part of a frame.
    start: usize,
    /// End of the bytes received.
    end: usize,
    frame_bytes_max: u32,
    error: Option<FrameError>,
}

impl FrameDecoder {
    /// A decoder that accepts frames with `frame_len <= frame_bytes_max`.
    pub fn new(frame_bytes_max: u32) -> FrameDecoder {
        FrameDecoder {
            buf: Vec::new(),
            start: 0,
            end: 0,
            frame_bytes_max: frame_bytes_max.max(FRAME_LEN_MIN),
            error: None,
        }
    }

    pub fn frame_bytes_max(&self) -> u32 {
        self.frame_bytes_max
    }

    /// The most bytes the decoder ever buffers: one frame of the largest size.
    pub fn buffer_bytes_max(&self) -> usize {
        LENGTH_PREFIX_BYTES + self.frame_bytes_max as usize
    }

    /// Bytes received and not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// The error that stopped the decoder, if any.
    pub fn error(&self) -> Option<FrameError> {
        self.error
    }

    /// Bytes the decoder accepts now. 0 when it holds a whole frame the
    /// caller has not taken yet, or after an error.
    pub fn space(&self) -> usize {
        if self.error.is_some() {
            return 0;
        }
        // A whole frame waiting: take it first (bounded input buffering).
        if let Some(total) = self.pending_frame_bytes() {
            if self.buffered() >= total {
                return 0;
            }
        }
        self.buffer_bytes_max().saturating_sub(self.buffered())
    }

    /// The opcode byte of the whole frame at the front of the buffer, if a
    /// whole frame is here (the frame stays; `next_frame` takes it).
    pub fn front_opcode(&self) -> Option<u8> {
        let total = self.pending_frame_bytes()?;
        if self.buffered() < total {
            return None;
        }
        self.buf.get(self.start + 5).copied()
    }

    /// True when bytes of a frame are here but not the whole frame.
    pub fn holds_partial_frame(&self) -> bool {
        self.buffered() > 0
            && self.error.is_none()
            && self
                .pending_frame_bytes()
                .is_none_or(|total| self.buffered() < total)
    }

    /// The input memory this decoder holds or is about to need: its buffer
    /// allocation, or the whole frame in progress once its length prefix is
    /// here (the buffer grows to it as the body arrives).
    pub fn memory_bytes(&self) -> usize {
        let frame = self
            .pending_frame_bytes()
            .map_or(0, |total| total.max(self.buffered()));
        self.buf.capacity().max(frame)
    }

    /// Bytes of the buffer allocation.
    pub fn allocated(&self) -> usize {
        self.buf.capacity()
    }

    /// True when the caller should read more bytes into the decoder.
    pub fn wants_read(&self) -> bool {
        self.space() > 0
    }

    /// Copies as many of `bytes` as the decoder accepts; returns how many.
    /// The caller keeps the rest and offers it again after taking frames.
    pub fn push(&mut self, bytes: &[u8]) -> usize {
        let spare = self.spare_mut_bounded(bytes.len());
        let n = spare.len().min(bytes.len());
        spare[..n].copy_from_slice(&bytes[..n]);
        self.commit(n);
        n
    }

    /// A writable region at the end of the buffer to read into (then call
    /// [`commit`](Self::commit)). Empty when [`space`](Self::space) is 0.
    pub fn spare_mut(&mut self) -> &mut [u8] {
        self.spare_mut_bounded(READ_CHUNK_BYTES)
    }

    /// Marks `n` bytes written into the region `spare_mut` returned as received.
    pub fn commit(&mut self, n: usize) {
        let limit = (self.end + self.space()).min(self.buf.len());
        self.end = (self.end + n).min(limit);
        self.check_prefix();
    }

    /// Reads once from `r` into the buffer. `Ok(0)` means end of stream, or
    /// that the decoder has no space (check [`wants_read`](Self::wants_read)).
    pub fn read_from<R: io::Read>(&mut self, r: &mut R) -> io::Result<usize> {
        let spare = self.spare_mut();
        if spare.is_empty() {
            return Ok(0);
        }
        let n = r.read(spare)?;
        self.commit(n);
        Ok(n)
    }

    /// The next whole frame, `Ok(None)` if more bytes are needed. The frame
    /// borrows the buffer; its bytes are released at the next call.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, FrameError> {
        let Some((total, header)) = self.front_total()? else {
            return Ok(None);
        };
        let frame_start = self.start;
        self.start += total;
        Ok(Some(self.frame_at(frame_start, total, header)))
    }

    /// Like [`next_frame`](Self::next_frame), but the frame stays at the
    /// front: the next call returns it again until
    /// [`consume_front`](Self::consume_front) takes it. For a request that
    /// cannot run yet and waits in the input buffer, in its turn
    /// (format-spec/protocol.md section 1.4).
    pub fn front_frame(&mut self) -> Result<Option<Frame<'_>>, FrameError> {
        let Some((total, header)) = self.front_total()? else {
            return Ok(None);
        };
        Ok(Some(self.frame_at(self.start, total, header)))
    }

    /// Takes the whole frame at the front (the one `front_frame` returned).
    pub fn consume_front(&mut self) {
        if let Some(total) = self.pending_frame_bytes() {
            if self.buffered() >= total {
                self.start += total;
            }
        }
    }

    /// Total bytes and header of the whole frame at the front, if one is
    /// here.
    fn front_total(&mut self) -> Result<Option<(usize, FrameHeader)>, FrameError> {
        self.check_prefix();
        if let Some(e) = self.error {
            return Err(e);
        }
        let Some(total) = self.pending_frame_bytes() else {
            return Ok(None);
        };
        if self.buffered() < total {
            return Ok(None);
        }
        // `total >= 16` bytes are here (the prefix was checked), so the
        // header parses; the error arm only keeps this free of panics.
        let Ok(header) = FrameHeader::parse(&self.buf[self.start..self.start + total]) else {
            let e = FrameError::TooShort {
                frame_len: (total - LENGTH_PREFIX_BYTES) as u32,
            };
            self.error = Some(e);
            return Err(e);
        };
        Ok(Some((total, header)))
    }

    /// The frame of `total` bytes at `at`, whose header is `header`.
    fn frame_at(&self, at: usize, total: usize, header: FrameHeader) -> Frame<'_> {
        let bytes = &self.buf[at..at + total];
        Frame {
            header,
            body: &bytes[FRAME_HEADER_BYTES..],
        }
    }

    /// Total bytes (prefix included) of the frame at `start`, once its
    /// length prefix is here and valid.
    fn pending_frame_bytes(&self) -> Option<usize> {
        let prefix = self.buf.get(self.start..self.end)?.first_chunk::<4>()?;
        let frame_len = u32::from_le_bytes(*prefix);
        if frame_len < FRAME_LEN_MIN || frame_len > self.frame_bytes_max {
            return None;
        }
        Some(LENGTH_PREFIX_BYTES + frame_len as usize)
    }

    /// Validates the length prefix of the frame at `start` as soon as its
    /// 4 bytes are here; an invalid one stops the decoder.
    fn check_prefix(&mut self) {
        if self.error.is_some() {
            return;
        }
        let Some(prefix) = self
            .buf
            .get(self.start..self.end)
            .and_then(|b| b.first_chunk::<4>())
        else {
            return;
        };
        let frame_len = u32::from_le_bytes(*prefix);
        if frame_len > self.frame_bytes_max {
            self.error = Some(FrameError::TooLarge {
                frame_len,
                max: self.frame_bytes_max,
            });
        } else if frame_len < FRAME_LEN_MIN {
            self.error = Some(FrameError::TooShort { frame_len });
        }
    }

    /// Makes room for up to `want` more bytes (bounded by `space()`, and by
    /// what the frame in progress still needs plus one read chunk) and
    /// returns the writable region.
    fn spare_mut_bounded(&mut self, want: usize) -> &mut [u8] {
        self.check_prefix();
        let space = self.space();
        if space == 0 {
            return &mut [];
        }
        // Drop the bytes of frames already returned.
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        // An idle connection gives back a buffer a large frame grew.
        if self.end == 0 && self.buf.len() > READ_CHUNK_BYTES {
            self.buf.truncate(READ_CHUNK_BYTES);
            self.buf.shrink_to(READ_CHUNK_BYTES);
        }
        let frame_rest = self
            .pending_frame_bytes()
            .map_or(0, |total| total.saturating_sub(self.end));
        let grow = want.min(space).min(frame_rest.max(READ_CHUNK_BYTES));
        let target = self.end + grow;
        if self.buf.len() < target {
            // Grow geometrically, but never reserve beyond one frame.
            if self.buf.capacity() < target {
                let cap = self
                    .buf
                    .capacity()
                    .saturating_mul(2)
                    .min(self.buffer_bytes_max())
                    .max(target);
                self.buf.reserve_exact(cap - self.buf.len());
            }
            self.buf.resize(target, 0);
        }
        let limit = (self.end + space).min(self.buf.len());
        &mut self.buf[self.end..limit]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(opcode: u8, request_id: u64, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let start = begin_frame(&mut out, 1, opcode, request_id);
        out.extend_from_slice(body);
        finish_frame(&mut out, start, 0).unwrap();
        out
    }

    #[test]
    fn splits_a_stream_fed_byte_by_byte() {
        let mut stream = frame(0x03, 1, b"");
        stream.extend(frame(0x20, 2, b"abcdef"));
        stream.extend(frame(0x04, 3, &[7; 100]));
        let mut d = FrameDecoder::new(1024);
        let mut got = Vec::new();
        for b in &stream {
            assert_eq!(d.push(std::slice::from_ref(b)), 1);
            while let Some(f) = d.next_frame().unwrap() {
                got.push((f.header.opcode, f.header.request_id, f.body.to_vec()));
            }
        }
        assert_eq!(
            got,
            vec![
                (0x03, 1, vec![]),
                (0x20, 2, b"abcdef".to_vec()),
                (0x04, 3, vec![7; 100])
            ]
        );
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn oversized_length_is_rejected_from_the_prefix_alone() {
        let max = 1000;
        let mut d = FrameDecoder::new(max);
        let prefix = (max + 1).to_le_bytes();
        assert_eq!(d.push(&prefix[..3]), 3);
        assert_eq!(d.next_frame(), Ok(None));
        assert_eq!(d.push(&prefix[3..]), 1);
        assert_eq!(
            d.next_frame(),
            Err(FrameError::TooLarge {
                frame_len: max + 1,
                max
            })
        );
        // Nothing more is accepted or buffered.
        assert_eq!(d.push(&[0u8; 64]), 0);
        assert!(d.spare_mut().is_empty());
        assert_eq!(d.buffered(), 4);
        assert!(d.buf.len() <= READ_CHUNK_BYTES);

        let mut d = FrameDecoder::new(max);
        assert_eq!(d.push(&u32::MAX.to_le_bytes()), 4);
        assert!(d.spare_mut().is_empty());
        assert_eq!(
            d.next_frame().unwrap_err().error_code(),
            ErrorCode::FrameTooLarge
        );
    }

    #[test]
    fn short_length_is_a_bad_frame() {
        let mut d = FrameDecoder::new(1000);
        d.push(&11u32.to_le_bytes());
        assert_eq!(d.next_frame(), Err(FrameError::TooShort { frame_len: 11 }));
    }

    #[test]
    fn a_frame_of_exactly_the_limit_is_accepted() {
        let max = FRAME_LEN_MIN + 50;
        let bytes = frame(0x03, 9, &[1; 50]);
        let mut d = FrameDecoder::new(max);
        assert_eq!(d.push(&bytes), bytes.len());
        assert_eq!(d.next_frame().unwrap().unwrap().body.len(), 50);
    }

    #[test]
    fn buffer_never_exceeds_one_frame_and_waits_for_the_caller() {
        let max = 100;
        let one = frame(0x03, 1, &[5; 88]); // frame_len exactly 100
        let mut stream = one.clone();
        stream.extend(&one);
        let mut d = FrameDecoder::new(max);
        // A flood is accepted only up to one frame.
        let n = d.push(&stream);
        assert_eq!(n, d.buffer_bytes_max());
        assert_eq!(d.push(&stream[n..]), 0);
        assert!(d.next_frame().unwrap().is_some());
        assert_eq!(d.push(&stream[n..]), stream.len() - n);
        assert!(d.next_frame().unwrap().is_some());
        assert!(d.buf.len() <= d.buffer_bytes_max());
    }

    #[test]
    fn read_from_reads_into_the_buffer() {
        let bytes = frame(0x20, 4, b"payload");
        let mut src: &[u8] = &bytes;
        let mut d = FrameDecoder::new(1 << 20);
        while d.read_from(&mut src).unwrap() > 0 {}
        let f = d.next_frame().unwrap().unwrap();
        assert_eq!(f.body, b"payload");
        // The buffer grew by a read chunk, not by the limit.
        assert!(d.buf.len() <= READ_CHUNK_BYTES);
    }

    #[test]
    fn parse_checks_the_length_prefix() {
        let bytes = frame(0x03, 1, b"xy");
        assert!(Frame::parse(&bytes).is_ok());
        assert!(matches!(
            Frame::parse(&bytes[..bytes.len() - 1]),
            Err(DecodeError::BadFrameLength { .. })
        ));
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Frame::parse(&longer).is_err());
        for n in 0..FRAME_HEADER_BYTES {
            assert!(Frame::parse(&bytes[..n]).is_err());
        }
    }
}
