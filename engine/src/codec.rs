//! The one place that uses bincode (pinned at 2.0.1), with one fixed
//! configuration: little-endian, fixed-width integers, a 1 GiB decode limit.
//!
//! Bytes, as format-spec/storage.md "bincode encoding" states them: `u8`/`bool`
//! as one byte, `u32`/`u64` as 4/8 little-endian bytes, a `Vec<T>` as its
//! length (u64) followed by its elements, a struct as its fields in order.
//! Callers wrap the output in a header with its own length and CRC, so
//! bincode never sees bytes that did not pass a checksum.

use bincode::config::{self, Configuration, Fixint, Limit, LittleEndian};

/// Largest body decoded; bounds the allocations a hostile length can claim.
pub const DECODE_LIMIT_BYTES: usize = 1 << 30;

type Config = Configuration<LittleEndian, Fixint, Limit<DECODE_LIMIT_BYTES>>;

fn config() -> Config {
    config::standard()
        .with_little_endian()
        .with_fixed_int_encoding()
        .with_limit::<DECODE_LIMIT_BYTES>()
}

pub fn encode<T: bincode::Encode>(value: &T) -> Vec<u8> {
    // Invariant: encoding into a Vec only fails on a limit, and bodies are
    // sized far below it by the engine's own limits.
    bincode::encode_to_vec(value, config()).expect("invariant: encodable value")
}

/// Decodes a whole buffer; trailing bytes are an error.
pub fn decode<T: bincode::Decode<()>>(bytes: &[u8]) -> Result<T, String> {
    let (value, used) = bincode::decode_from_slice(bytes, config()).map_err(|e| e.to_string())?;
    if used != bytes.len() {
        return Err(format!("{} trailing bytes", bytes.len() - used));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(bincode::Encode, bincode::Decode, Debug, PartialEq)]
    struct Sample {
        a: u64,
        b: Vec<u32>,
        c: bool,
    }

    #[test]
    fn layout_is_the_documented_one() {
        let bytes = encode(&Sample {
            a: 1,
            b: vec![2, 3],
            c: true,
        });
        let expected: Vec<u8> = [
            &1u64.to_le_bytes()[..],
            &2u64.to_le_bytes()[..],
            &2u32.to_le_bytes()[..],
            &3u32.to_le_bytes()[..],
            &[1u8][..],
        ]
        .concat();
        assert_eq!(bytes, expected);
        assert_eq!(
            decode::<Sample>(&bytes).unwrap(),
            Sample {
                a: 1,
                b: vec![2, 3],
                c: true
            }
        );
    }

    #[test]
    fn hostile_lengths_and_trailing_bytes_are_errors() {
        let mut bytes = encode(&Sample {
            a: 1,
            b: vec![],
            c: false,
        });
        bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode::<Sample>(&bytes).is_err());
        let mut ok = encode(&Sample {
            a: 1,
            b: vec![],
            c: false,
        });
        ok.push(0);
        assert!(decode::<Sample>(&ok).is_err());
    }
}
