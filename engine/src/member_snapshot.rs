//! The memberships section of a checkpoint: every membership with its
//! cursor and join point, in a compact varint form (typically 5-9 bytes per
//! membership; see format-spec/storage.md "Memberships section").
//!
//! Format: `varint users`, then per user
//! `{ varint user_id | varint n | n x { varint group_ordinal_delta | varint cursor |
//!    varint zigzag(cursor + 1 - join_point) } }`
//! where `group_ordinal` indexes the checkpoint's group list and increases
//! within a user (delta from the previous one, the first from 0).
//! varint = unsigned LEB128, at most 10 bytes.

use crate::cursors::MemberCursor;

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Reads varints from a buffer, with the offset for error messages.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn varint(&mut self) -> Result<u64, String> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(format!("truncated varint at offset {}", self.pos));
            };
            self.pos += 1;
            if i == 9 && b > 1 {
                return Err(format!("varint overflows u64 at offset {}", self.pos - 1));
            }
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!(
            "varint longer than 10 bytes at offset {}",
            self.pos
        ))
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }
}

/// Encodes one user's memberships; `ordinal(slot)` maps a slot to the
/// group's index in the checkpoint's group list (increasing with slot).
pub fn encode_user(
    out: &mut Vec<u8>,
    user: u64,
    ms: &[MemberCursor],
    ordinal: impl Fn(u32) -> u64,
) {
    put_varint(out, user);
    put_varint(out, ms.len() as u64);
    let mut prev = 0;
    for m in ms {
        let o = ordinal(m.slot);
        put_varint(out, o - prev);
        prev = o;
        put_varint(out, m.cursor);
        put_varint(
            out,
            zigzag(
                (m.cursor as i64)
                    .wrapping_add(1)
                    .wrapping_sub(m.join_point as i64),
            ),
        );
    }
}

/// One decoded membership.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotMembership {
    pub user: u64,
    pub group_ordinal: u64,
    pub cursor: u64,
    pub join_point: u64,
}

/// Decodes a whole section, calling `f` per membership. Counts are checked
/// against the bytes left, so a hostile count cannot make this loop long.
pub fn decode(
    buf: &[u8],
    mut f: impl FnMut(SnapshotMembership) -> Result<(), String>,
) -> Result<(), String> {
    let mut r = Reader::new(buf);
    let users = r.varint()?;
    if users > buf.len() as u64 {
        return Err(format!("{users} users cannot fit in {} bytes", buf.len()));
    }
    for _ in 0..users {
        let user = r.varint()?;
        let n = r.varint()?;
        if n > (buf.len() - r.pos) as u64 {
            return Err(format!("{n} memberships cannot fit in the bytes left"));
        }
        let mut ordinal: u64 = 0;
        for _ in 0..n {
            ordinal = ordinal
                .checked_add(r.varint()?)
                .ok_or("group ordinal overflows")?;
            let cursor = r.varint()?;
            let delta = unzigzag(r.varint()?);
            let join_point = (cursor as i64).wrapping_add(1).wrapping_sub(delta) as u64;
            f(SnapshotMembership {
                user,
                group_ordinal: ordinal,
                cursor,
                join_point,
            })?;
        }
    }
    if !r.is_empty() {
        return Err(format!("{} trailing bytes", buf.len() - r.pos));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_size() {
        let mut out = Vec::new();
        put_varint(&mut out, 2);
        let a = [
            MemberCursor {
                slot: 3,
                cursor: 90_000,
                join_point: 80_001,
            },
            MemberCursor {
                slot: 7,
                cursor: 12,
                join_point: 13,
            },
        ];
        encode_user(&mut out, 1_000_001, &a, |s| s as u64);
        encode_user(
            &mut out,
            5,
            &[MemberCursor {
                slot: 0,
                cursor: 0,
                join_point: 1,
            }],
            |s| s as u64,
        );
        let mut got = Vec::new();
        decode(&out, |m| {
            got.push(m);
            Ok(())
        })
        .unwrap();
        assert_eq!(
            got,
            vec![
                SnapshotMembership {
                    user: 1_000_001,
                    group_ordinal: 3,
                    cursor: 90_000,
                    join_point: 80_001
                },
                SnapshotMembership {
                    user: 1_000_001,
                    group_ordinal: 7,
                    cursor: 12,
                    join_point: 13
                },
                SnapshotMembership {
                    user: 5,
                    group_ordinal: 0,
                    cursor: 0,
                    join_point: 1
                },
            ]
        );
        assert!(out.len() <= 3 * 16);
        for n in 0..out.len() {
            assert!(decode(&out[..n], |_| Ok(())).is_err(), "truncation at {n}");
        }
    }

    #[test]
    fn hostile_counts_fail_fast() {
        let mut out = Vec::new();
        put_varint(&mut out, u64::MAX);
        assert!(decode(&out, |_| Ok(())).is_err());
        assert!(Reader::new(&[0xff; 11]).varint().is_err());
    }
}
