//! Shards: which replica set of a cluster holds a group
//! (format-spec/cluster.md section 9, protocol.md 4.33).
//!
//! A cluster has [`SHARD_COUNT`] shards; group `g` is in shard
//! [`shard`]`(g)`, the top 10 bits of a Fibonacci hash of `g` (one
//! multiply, so a client in any language computes it); each shard belongs
//! to exactly one replica set. The node, the client library and the
//! `tidemark` binary (the map file) all route by this one function and
//! this one table, so they cannot disagree about a group's set.
//!
//! Representation: a [`ShardTable`] is the owning set id of each shard, an
//! array of 1024 `u32` (4 KiB), built from ranges of shards; it is the only
//! form a lookup uses (one multiply and one index). On the wire and in the
//! map file the table travels as [`ShardRange`]s (first and last shard,
//! set id): a cluster of a few sets is a few ranges.
//!
//! Invariant: a `ShardTable` assigns every shard exactly once
//! ([`ShardTable::from_ranges`] refuses gaps and overlaps, with a typed
//! error naming the shard).

use std::fmt;

/// Shards of a cluster. Fixed: changing it moves almost every group.
pub const SHARD_COUNT: u32 = 1024;

/// The multiplier of the Fibonacci hash: `2^64 / φ`, odd.
pub const SHARD_HASH_MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

/// The shard of group `g`: `(g * 0x9E3779B97F4A7C15 mod 2^64) >> 54`.
/// Sequential group ids land far apart and spread evenly over the shards.
pub const fn shard(group: u64) -> u16 {
    // 64 - 10 bits: the top 10 bits of the product; below 1024, fits u16.
    (group.wrapping_mul(SHARD_HASH_MULTIPLIER) >> 54) as u16
}

/// Shards `first..=last` owned by set `set_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardRange {
    pub first: u16,
    pub last: u16,
    pub set_id: u32,
}

/// Why ranges do not make a shard table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardTableError {
    /// A range whose first shard is above its last, or whose last shard is
    /// not below [`SHARD_COUNT`].
    BadRange { first: u16, last: u16 },
    /// A shard two ranges assign.
    AssignedTwice { shard: u16, sets: (u32, u32) },
    /// A shard no range assigns (the lowest such).
    Unassigned { shard: u16 },
}

impl fmt::Display for ShardTableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShardTableError::BadRange { first, last } => write!(
                f,
                "shard range {first}..={last} is not within 0..={}",
                SHARD_COUNT - 1
            ),
            ShardTableError::AssignedTwice { shard, sets } => write!(
                f,
                "shard {shard} is assigned twice (to sets {} and {})",
                sets.0, sets.1
            ),
            ShardTableError::Unassigned { shard } => {
                write!(f, "shard {shard} is assigned to no set")
            }
        }
    }
}

impl std::error::Error for ShardTableError {}

/// The owning set of every shard (module docs).
#[derive(Clone, PartialEq, Eq)]
pub struct ShardTable {
    /// `owners[s]`: the set id of shard `s`; `SHARD_COUNT` entries.
    owners: Box<[u32]>,
}

impl ShardTable {
    /// Every shard owned by one set (a single node, or one replica set).
    pub fn single(set_id: u32) -> ShardTable {
        ShardTable {
            owners: vec![set_id; SHARD_COUNT as usize].into_boxed_slice(),
        }
    }

    /// The table the ranges describe, in any order; each shard must be in
    /// exactly one range.
    pub fn from_ranges(ranges: &[ShardRange]) -> Result<ShardTable, ShardTableError> {
        let mut owners: Vec<Option<u32>> = vec![None; SHARD_COUNT as usize];
        for r in ranges {
            if r.first > r.last || u32::from(r.last) >= SHARD_COUNT {
                return Err(ShardTableError::BadRange {
                    first: r.first,
                    last: r.last,
                });
            }
            for s in r.first..=r.last {
                let slot = &mut owners[usize::from(s)];
                if let Some(other) = *slot {
                    return Err(ShardTableError::AssignedTwice {
                        shard: s,
                        sets: (other, r.set_id),
                    });
                }
                *slot = Some(r.set_id);
            }
        }
        let mut out = Vec::with_capacity(SHARD_COUNT as usize);
        for (s, o) in owners.into_iter().enumerate() {
            match o {
                Some(set) => out.push(set),
                // `s` < SHARD_COUNT (1024) fits u16.
                None => return Err(ShardTableError::Unassigned { shard: s as u16 }),
            }
        }
        Ok(ShardTable {
            owners: out.into_boxed_slice(),
        })
    }

    /// The set holding group `group`.
    pub fn set_of(&self, group: u64) -> u32 {
        self.owners[usize::from(shard(group))]
    }

    /// The set owning shard `s` (`s < SHARD_COUNT`), `None` above.
    pub fn owner(&self, s: u16) -> Option<u32> {
        self.owners.get(usize::from(s)).copied()
    }

    /// The table as maximal runs of shards of one set, ascending: the
    /// compact form of the wire and of `tidemark cluster map`.
    pub fn ranges(&self) -> Vec<ShardRange> {
        let mut out: Vec<ShardRange> = Vec::new();
        for (s, &set) in self.owners.iter().enumerate() {
            // `s` < SHARD_COUNT (1024) fits u16.
            let s = s as u16;
            match out.last_mut() {
                Some(r) if r.set_id == set => r.last = s,
                _ => out.push(ShardRange {
                    first: s,
                    last: s,
                    set_id: set,
                }),
            }
        }
        out
    }

    /// The distinct set ids, ascending.
    pub fn sets(&self) -> Vec<u32> {
        let mut sets: Vec<u32> = self.owners.to_vec();
        sets.sort_unstable();
        sets.dedup();
        sets
    }
}

impl fmt::Debug for ShardTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.ranges()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectors of format-spec/cluster.md section 9, read from its
    /// table (`| g | shard(g) |`), so the spec and the code cannot part.
    #[test]
    fn the_shard_function_matches_the_spec_vectors() {
        let spec = include_str!("../../../format-spec/cluster.md");
        let table = spec
            .split("| g | shard(g) |")
            .nth(1)
            .expect("cluster.md has the table of shard vectors");
        let mut checked = Vec::new();
        for line in table.lines().skip(2) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let [_, g, expected, _] = cells[..] else {
                break; // the end of the table
            };
            let g = match g {
                "2^64 - 1" => u64::MAX,
                g => g.parse().expect("a group id"),
            };
            let expected: u16 = expected.parse().expect("a shard");
            assert_eq!(shard(g), expected, "shard({g})");
            checked.push(g);
        }
        assert_eq!(checked, [0, 1, 2, 3, 7, 1000, u64::MAX], "the spec's rows");
    }

    #[test]
    fn sequential_groups_spread_evenly_over_the_shards() {
        let mut per_shard = vec![0u32; SHARD_COUNT as usize];
        for g in 1..=(SHARD_COUNT as u64 * 16) {
            per_shard[usize::from(shard(g))] += 1;
        }
        let (min, max) = (
            per_shard.iter().min().copied().unwrap_or(0),
            per_shard.iter().max().copied().unwrap_or(0),
        );
        // 16 per shard on average; Fibonacci hashing keeps them within a few.
        assert!(min >= 12 && max <= 20, "min {min}, max {max}");
    }

    #[test]
    fn ranges_make_a_table_and_come_back_compact() {
        let ranges = [
            ShardRange {
                first: 512,
                last: 1023,
                set_id: 2,
            },
            ShardRange {
                first: 0,
                last: 511,
                set_id: 1,
            },
        ];
        let t = ShardTable::from_ranges(&ranges).unwrap();
        assert_eq!(t.owner(0), Some(1));
        assert_eq!(t.owner(511), Some(1));
        assert_eq!(t.owner(512), Some(2));
        assert_eq!(t.owner(1024), None);
        assert_eq!(t.set_of(1), 2, "shard(1) = 632");
        assert_eq!(t.set_of(2), 1, "shard(2) = 241");
        assert_eq!(t.ranges(), vec![ranges[1], ranges[0]]);
        assert_eq!(t.sets(), vec![1, 2]);
        assert_eq!(ShardTable::single(5).ranges().len(), 1);
    }

    #[test]
    fn gaps_overlaps_and_bad_ranges_are_refused() {
        let r = |first, last, set_id| ShardRange {
            first,
            last,
            set_id,
        };
        assert_eq!(
            ShardTable::from_ranges(&[r(0, 511, 1), r(513, 1023, 2)]),
            Err(ShardTableError::Unassigned { shard: 512 })
        );
        assert_eq!(
            ShardTable::from_ranges(&[r(0, 600, 1), r(600, 1023, 2)]),
            Err(ShardTableError::AssignedTwice {
                shard: 600,
                sets: (1, 2)
            })
        );
        assert_eq!(
            ShardTable::from_ranges(&[r(0, 1024, 1)]),
            Err(ShardTableError::BadRange {
                first: 0,
                last: 1024
            })
        );
        assert_eq!(
            ShardTable::from_ranges(&[r(9, 3, 1)]),
            Err(ShardTableError::BadRange { first: 9, last: 3 })
        );
        assert_eq!(
            ShardTable::from_ranges(&[]),
            Err(ShardTableError::Unassigned { shard: 0 })
        );
    }
}
