//! Primitive types of the wire format (format-spec/protocol.md "Primitive
//! types"): little-endian integers, bool, bytes, string and list counts, a
//! bounds-checked reader, and the typed errors of decoding and encoding.
//!
//! Every read checks the remaining bytes first; a length or count is checked
//! against the bytes that remain before anything is sliced or allocated, so a
//! count of four billion with ten bytes left is an error, not an allocation.

use std::fmt;

use super::error_code::ErrorCode;

/// Why a frame's bytes are not a valid frame of this protocol version.
///
/// Offsets count from the first byte of the frame (the first byte of the
/// length prefix), so they point into a hex dump of the whole frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The header's version byte is not a version this codec speaks.
    UnsupportedVersion { version: u8 },
    /// The opcode is not one of the frames `expected` ("request" or
    /// "response") in this version.
    UnknownOpcode { opcode: u8, expected: &'static str },
    /// Flag bits set that this version does not define (all, in version 1).
    UnknownFlags { flags: u16 },
    /// A request with request id 0, a response other than ERROR with id 0, or
    /// a server-initiated frame with a nonzero id.
    BadRequestId {
        request_id: u64,
        reason: &'static str,
    },
    /// A fixed-size field runs past the end of the body.
    Truncated {
        field: &'static str,
        offset: usize,
        need: usize,
        have: usize,
    },
    /// A byte length or list count larger than the bytes that remain could
    /// hold (`count` elements of at least `elem_bytes_min` bytes each).
    CountTooLarge {
        field: &'static str,
        offset: usize,
        count: u32,
        elem_bytes_min: usize,
        remaining: usize,
    },
    /// A value outside its field's domain: a bool other than 0/1, an unknown
    /// enum tag, a must-be-zero field that is not zero.
    InvalidValue {
        field: &'static str,
        offset: usize,
        value: u64,
    },
    /// A string field that is not UTF-8.
    InvalidUtf8 { field: &'static str, offset: usize },
    /// Bytes left over after the last field of the body.
    TrailingBytes { offset: usize, count: usize },
    /// A records section whose records do not tile it: a `record_len` below
    /// 44 or past the end of the section, or a record count that differs
    /// from the declared one.
    BadRecords { offset: usize, reason: &'static str },
    /// A buffer given to `Frame::parse` whose length prefix does not match
    /// its size, or is below the 12-byte minimum.
    BadFrameLength { frame_len: u32, have: usize },
}

impl DecodeError {
    /// The wire error code the server answers this with (both are fatal).
    pub fn error_code(&self) -> ErrorCode {
        match self {
            DecodeError::UnsupportedVersion { .. } => ErrorCode::UnsupportedVersion,
            _ => ErrorCode::BadFrame,
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::UnsupportedVersion { version } => {
                write!(f, "unsupported protocol version {version}")
            }
            DecodeError::UnknownOpcode { opcode, expected } => {
                write!(f, "opcode {opcode:#04x} is not a {expected} opcode")
            }
            DecodeError::UnknownFlags { flags } => {
                write!(f, "undefined frame flags {flags:#06x}")
            }
            DecodeError::BadRequestId { request_id, reason } => {
                write!(f, "request id {request_id}: {reason}")
            }
            DecodeError::Truncated {
                field,
                offset,
                need,
                have,
            } => write!(
                f,
                "truncated {field} at offset {offset}: need {need} bytes, have {have}"
            ),
            DecodeError::CountTooLarge {
                field,
                offset,
                count,
                elem_bytes_min,
                remaining,
            } => write!(
                f,
                "{field} at offset {offset}: count {count} of at least {elem_bytes_min} bytes \
                 each exceeds the {remaining} bytes left"
            ),
            DecodeError::InvalidValue {
                field,
                offset,
                value,
            } => write!(f, "invalid {field} {value} at offset {offset}"),
            DecodeError::InvalidUtf8 { field, offset } => {
                write!(f, "{field} at offset {offset} is not UTF-8")
            }
            DecodeError::TrailingBytes { offset, count } => {
                write!(f, "{count} trailing bytes at offset {offset}")
            }
            DecodeError::BadRecords { offset, reason } => {
                write!(f, "bad records section at offset {offset}: {reason}")
            }
            DecodeError::BadFrameLength { frame_len, have } => write!(
                f,
                "frame length prefix {frame_len} does not match the {have} bytes after it"
            ),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Why a value cannot be encoded. Encoders check sizes instead of panicking,
/// because payloads and lists come from the encoder's caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// A bytes, string or list field longer than a u32 length can say.
    TooLong { field: &'static str, len: usize },
    /// The whole frame is longer than the u32 length prefix can say.
    FrameTooLarge { frame_len: u64 },
    /// A request id the frame kind does not allow (0 for a request or a
    /// response other than ERROR; nonzero for PUSH and RESYNC).
    BadRequestId {
        request_id: u64,
        reason: &'static str,
    },
    /// A frame the protocol version does not have (RECALL in version 1).
    NotInVersion { what: &'static str, version: u8 },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::TooLong { field, len } => {
                write!(f, "{field} of {len} elements does not fit a u32 length")
            }
            EncodeError::FrameTooLarge { frame_len } => {
                write!(f, "frame of {frame_len} bytes does not fit a u32 length")
            }
            EncodeError::BadRequestId { request_id, reason } => {
                write!(f, "request id {request_id}: {reason}")
            }
            EncodeError::NotInVersion { what, version } => {
                write!(f, "{what} does not exist in protocol version {version}")
            }
        }
    }
}

impl std::error::Error for EncodeError {}

/// A cursor over a frame body that checks every read.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Offset of `buf[0]` in the frame, for error offsets.
    base: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], base: usize) -> Self {
        Reader { buf, pos: 0, base }
    }

    /// Frame offset of the next byte to read.
    pub(crate) fn offset(&self) -> usize {
        self.base + self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn rest(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or(&[])
    }

    /// Takes exactly `n` bytes.
    pub(crate) fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let rest = self.rest();
        match rest.get(..n) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(DecodeError::Truncated {
                field,
                offset: self.offset(),
                need: n,
                have: rest.len(),
            }),
        }
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let rest = self.rest();
        match rest.first_chunk::<N>() {
            Some(a) => {
                self.pos += N;
                Ok(*a)
            }
            None => Err(DecodeError::Truncated {
                field,
                offset: self.offset(),
                need: N,
                have: rest.len(),
            }),
        }
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// A bool: exactly 0 or 1.
    pub(crate) fn bool(&mut self, field: &'static str) -> Result<bool, DecodeError> {
        let offset = self.offset();
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(DecodeError::InvalidValue {
                field,
                offset,
                value: u64::from(v),
            }),
        }
    }

    /// A group or user id: any u64 but 0, which is reserved.
    pub(crate) fn id(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        let offset = self.offset();
        match self.u64(field)? {
            0 => Err(DecodeError::InvalidValue {
                field,
                offset,
                value: 0,
            }),
            v => Ok(v),
        }
    }

    /// A u64 that must be zero (a field unused in this variant).
    pub(crate) fn zero_u64(&mut self, field: &'static str) -> Result<(), DecodeError> {
        let offset = self.offset();
        match self.u64(field)? {
            0 => Ok(()),
            v => Err(DecodeError::InvalidValue {
                field,
                offset,
                value: v,
            }),
        }
    }

    /// A u32 count of elements of at least `elem_bytes_min` bytes each,
    /// checked against the remaining bytes before the caller allocates.
    pub(crate) fn count(
        &mut self,
        field: &'static str,
        elem_bytes_min: usize,
    ) -> Result<usize, DecodeError> {
        let offset = self.offset();
        let count = self.u32(field)?;
        let remaining = self.remaining();
        // u64 arithmetic: u32::MAX * elem_bytes_min cannot overflow it.
        let need = u64::from(count).saturating_mul(elem_bytes_min as u64);
        if need > remaining as u64 {
            return Err(DecodeError::CountTooLarge {
                field,
                offset,
                count,
                elem_bytes_min,
                remaining,
            });
        }
        // Fits: count * elem_bytes_min <= remaining, a usize.
        Ok(count as usize)
    }

    /// `bytes`: u32 length, then that many bytes.
    pub(crate) fn bytes(&mut self, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let n = self.count(field, 1)?;
        self.take(n, field)
    }

    /// `string`: u32 length, then that many bytes of UTF-8.
    pub(crate) fn str(&mut self, field: &'static str) -> Result<&'a str, DecodeError> {
        let offset = self.offset() + 4;
        let b = self.bytes(field)?;
        std::str::from_utf8(b).map_err(|_| DecodeError::InvalidUtf8 { field, offset })
    }

    /// Ends the body: any byte left over is an error.
    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(DecodeError::TrailingBytes {
                offset: self.offset(),
                count,
            }),
        }
    }
}

pub(crate) fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}

pub(crate) fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_bool(out: &mut Vec<u8>, v: bool) {
    out.push(u8::from(v));
}

/// A u32 length or count; `len` above u32::MAX is an error.
pub(crate) fn put_count(
    out: &mut Vec<u8>,
    len: usize,
    field: &'static str,
) -> Result<(), EncodeError> {
    let n = u32::try_from(len).map_err(|_| EncodeError::TooLong { field, len })?;
    put_u32(out, n);
    Ok(())
}

pub(crate) fn put_bytes(
    out: &mut Vec<u8>,
    b: &[u8],
    field: &'static str,
) -> Result<(), EncodeError> {
    put_count(out, b.len(), field)?;
    out.extend_from_slice(b);
    Ok(())
}

pub(crate) fn put_str(out: &mut Vec<u8>, s: &str, field: &'static str) -> Result<(), EncodeError> {
    put_bytes(out, s.as_bytes(), field)
}
