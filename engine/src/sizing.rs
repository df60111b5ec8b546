//! How many groups a node holds by default: `groups_max` follows the
//! memory the process may use (format-spec/storage.md section 15.4,
//! "Memory cost"; README "Sizing").
//!
//! The rule: [`GROUPS_MEMORY_SHARE`] of the usable memory, divided by what
//! one group of the sized mix costs resident ([`SIZED_GROUP_BYTES`]: an
//! idle group, [`SIZED_MEMBERSHIPS_PER_GROUP`] memberships and one user),
//! clamped to `[GROUPS_MAX_FLOOR, GROUPS_MAX_CEILING]`. The usable memory
//! is the cgroup's memory limit when one is set (v2 `memory.max`, v1
//! `memory.limit_in_bytes`), else the physical memory, whichever is lower.
//! The rest of the memory is left to what the count of groups does not
//! bound: busy groups' send state and loaded logs, open segments, the
//! page cache of the journal and segments, connections' buffers, and a
//! checkpoint's transient delta buffer.
//!
//! The per-item figures are resident bytes measured from outside after
//! creation bursts (BENCHMARKS.md, "Memory per idle group and per
//! membership"), rounded up; the allocator-counted figures are smaller
//! (`engine/tests/memory.rs`).

use std::sync::OnceLock;

/// Resident bytes of one idle group: the group itself (`group.rs`), its
/// catalog entries (`catalog.rs`), an idle small group's extent list.
pub const IDLE_GROUP_BYTES: u64 = 256;
/// Resident bytes of one membership: 16 in the cursor table (plus the
/// room of the user's range in its shard's store) and 8 in the group's
/// member list (`user_lists.rs`, `membership.rs`): 29.6 measured since
/// the lists share one store per shard (37.3 when this figure was set; it
/// keeps that margin).
pub const MEMBERSHIP_BYTES: u64 = 40;
/// Resident bytes of one user (a member of any group): its cursor-table
/// hash entry at the map's load factor and its list's allocation.
pub const USER_BYTES: u64 = 64;
/// Memberships per group of the sized mix: an IM node's, 80% two-member
/// chats and a long tail of larger groups (the population benchmark's
/// mix holds 10.8 per group), with as many users as groups.
pub const SIZED_MEMBERSHIPS_PER_GROUP: u64 = 11;
/// What one group of the sized mix costs: 760 bytes.
pub const SIZED_GROUP_BYTES: u64 =
    IDLE_GROUP_BYTES + SIZED_MEMBERSHIPS_PER_GROUP * MEMBERSHIP_BYTES + USER_BYTES;
/// The share of the usable memory the groups of the sized mix may take,
/// as a fraction `(numerator, denominator)`: one half.
pub const GROUPS_MEMORY_SHARE: (u64, u64) = (1, 2);
/// The smallest default, whatever the memory: a node in a tiny container
/// still holds a useful number of groups (then sized by hand).
pub const GROUPS_MAX_FLOOR: usize = 10_000;
/// The largest value `groups_max` may take (slots are `u32`, and
/// `u32::MAX` is never a slot: `Config::validate`).
pub const GROUPS_MAX_CEILING: usize = u32::MAX as usize - 1;
/// The default when the memory cannot be read (a system without
/// `/proc/meminfo` and cgroup files).
pub const GROUPS_MAX_UNKNOWN_MEMORY: usize = 10_000_000;

/// `groups_max` for a process that may use `memory_bytes`: a pure
/// function of the memory (module docs).
pub fn groups_max_for_memory(memory_bytes: u64) -> usize {
    let (num, den) = GROUPS_MEMORY_SHARE;
    let groups = u128::from(memory_bytes) * u128::from(num)
        / u128::from(den)
        / u128::from(SIZED_GROUP_BYTES);
    usize::try_from(groups)
        .unwrap_or(usize::MAX)
        .clamp(GROUPS_MAX_FLOOR, GROUPS_MAX_CEILING)
}

/// The default `groups_max` of this process: from the usable memory, read
/// once (the machine's memory does not change while it runs).
pub fn default_groups_max() -> usize {
    static GROUPS_MAX: OnceLock<usize> = OnceLock::new();
    *GROUPS_MAX.get_or_init(|| {
        usable_memory_bytes().map_or(GROUPS_MAX_UNKNOWN_MEMORY, groups_max_for_memory)
    })
}

/// The memory this process may use: its cgroup's limit if it has one,
/// capped by the physical memory. `None` when neither can be read.
pub fn usable_memory_bytes() -> Option<u64> {
    let physical = read("/proc/meminfo").and_then(|t| meminfo_total_bytes(&t));
    let cgroup = cgroup_limit_bytes();
    match (physical, cgroup) {
        (Some(p), Some(c)) => Some(p.min(c)),
        (p, c) => p.or(c),
    }
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn meminfo_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The memory limit of this process's cgroup: v2 (`memory.max` of the
/// path `/proc/self/cgroup` names, `max` meaning none), else v1
/// (`memory.limit_in_bytes`, whose "no limit" is a value near 2^63, which
/// the physical memory caps).
fn cgroup_limit_bytes() -> Option<u64> {
    let own = read("/proc/self/cgroup").unwrap_or_default();
    let v2_path = own.lines().find_map(|l| l.strip_prefix("0::"));
    if let Some(path) = v2_path {
        let path = path.trim().trim_end_matches('/');
        if let Some(text) = read(&format!("/sys/fs/cgroup{path}/memory.max")) {
            return parse_limit(&text);
        }
    }
    read("/sys/fs/cgroup/memory/memory.limit_in_bytes").and_then(|t| parse_limit(&t))
}

/// A cgroup memory file's value: bytes, or `None` for `max` (no limit)
/// and anything unreadable.
fn parse_limit(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_default_is_half_the_memory_over_a_sized_group() {
        assert_eq!(SIZED_GROUP_BYTES, 760);
        // 24 GiB: 12 GiB of groups at 760 bytes each.
        assert_eq!(groups_max_for_memory(24 * GIB), 16_953_818);
        assert_eq!(groups_max_for_memory(4 * GIB), 2_825_636);
        // The old fixed default, 10,000,000 groups, is what 15.2 GB gives.
        assert_eq!(groups_max_for_memory(15_200_000_000), 10_000_000);
        // Linear in the memory.
        assert_eq!(
            groups_max_for_memory(8 * GIB),
            2 * groups_max_for_memory(4 * GIB)
        );
    }

    #[test]
    fn the_default_is_clamped_to_the_floor_and_the_slot_ceiling() {
        assert_eq!(groups_max_for_memory(0), GROUPS_MAX_FLOOR);
        assert_eq!(groups_max_for_memory(64 << 20), 44_150);
        assert_eq!(groups_max_for_memory(8 << 20), GROUPS_MAX_FLOOR);
        assert_eq!(groups_max_for_memory(u64::MAX), GROUPS_MAX_CEILING);
        assert_eq!(
            groups_max_for_memory(8 << 40),
            GROUPS_MAX_CEILING,
            "8 TiB holds more groups than slots"
        );
        assert_eq!(groups_max_for_memory(4 << 40), 2_893_451_652);
    }

    #[test]
    fn memory_files_are_parsed_and_no_limit_is_none() {
        let meminfo = "MemTotal:       24569124 kB\nMemFree:         4000000 kB\n";
        assert_eq!(meminfo_total_bytes(meminfo), Some(24_569_124 * 1024));
        assert_eq!(meminfo_total_bytes("MemFree: 1 kB\n"), None);
        assert_eq!(parse_limit("4294967296\n"), Some(4 * GIB));
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit(""), None);
    }

    #[test]
    fn this_machine_gives_a_valid_default() {
        let max = default_groups_max();
        assert!((GROUPS_MAX_FLOOR..=GROUPS_MAX_CEILING).contains(&max));
        if let Some(memory) = usable_memory_bytes() {
            assert_eq!(max, groups_max_for_memory(memory));
        }
    }
}
