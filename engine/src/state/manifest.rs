//! Manifests: `manifest/<ckpt seq>.tmm`, one immutable file per stored
//! checkpoint, naming the runs that hold the state and the journal
//! position replay starts from (format-spec/storage.md section 6.3). The
//! two newest valid ones are kept: the older is the fallback when the
//! newer is unreadable.
//!
//! Format (little-endian):
//! `{ magic "TDMKMANI" | version u16 = 2 | header_len u16 = 32 | reserved u32 = 0 |
//!    body_len u64 | body_crc u32 | header_crc u32 (of bytes 0..28) | body }`,
//! body: `{ ckpt_seq u64 | replay_journal_seq u64 | replay_lsn u64 |
//!    replay_round u64 | created_ms u64 | next_run_seq u64 | clean u8 |
//!    reserved [3] = 0 |
//!    run_count u32 | runs, newest first: { run_seq u64 | part_count u32 |
//!    parts: { item_count u64 | file_len u64 | trailer_crc u32 |
//!    first_key (17) | last_key (17) } } |
//!    pinned_count u32 | pinned: file id u64 (a journal file's seq, each
//!    below replay_journal_seq, or 2^31 + a cold file's seq), ascending |
//!    groups_per_user_bound u64 | groups_bound u64 | user_index u8 (0/1) }`.
//! Version 2 added the pinned list (the journal files before the replay
//! position that small groups' records are in, `pins.rs`); version 3 the
//! bounds on any user's groups and on the groups (a join or a creation
//! decided before every group is loaded, `commit/loading.rs`); version 4
//! the flag saying the runs hold a complete user index (storage.md 6.1:
//! a user's groups looked up before every group is loaded). Versions 2
//! and 3 are still read (the bounds unknown in 2, the index incomplete in
//! both); a version 1 manifest is refused like any unsupported version.
//!
//! Its size grows with the number of run parts, not with the state; the
//! reader refuses more than [`MANIFEST_BYTES_MAX`] and the encoder checks
//! the same constant.

use std::path::{Path, PathBuf};

use super::run::{PartMeta, RUN_FILE_BYTES_READ_MAX, RUN_HEADER_BYTES, RUN_TRAILER_BYTES};
use super::{check_header, put_key, read_key, Reader, KEY_BYTES};
use crate::error::{Error, Result};
use crate::io::{OpenMode, Vfs};

pub(crate) const MANIFEST_MAGIC: [u8; 8] = *b"TDMKMANI";
pub(crate) const MANIFEST_VERSION: u16 = 4;
/// The version before the `user_index` flag, still read (the index is
/// then incomplete).
const MANIFEST_VERSION_UNINDEXED: u16 = 3;
/// The version before `groups_per_user_bound`, still read.
const MANIFEST_VERSION_UNBOUNDED: u16 = 2;
pub(crate) const MANIFEST_HEADER_BYTES: usize = 32;
/// The largest manifest a reader accepts and a writer writes.
pub(crate) const MANIFEST_BYTES_MAX: u64 = 64 << 20;

const RUN_FIXED_BYTES: usize = 8 + 4;
const PART_BYTES: usize = 8 + 8 + 4 + 2 * KEY_BYTES;

/// One run as a manifest names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RunMeta {
    pub run_seq: u64,
    /// Its parts in order (part `i` is `parts[i]`), key ranges increasing.
    pub parts: Vec<PartMeta>,
}

impl RunMeta {
    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.file_len).sum()
    }

    /// Items of all parts (groups and member rows).
    pub fn items(&self) -> u64 {
        self.parts.iter().map(|p| p.item_count).sum()
    }
}

/// What a stored checkpoint is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Manifest {
    pub ckpt_seq: u64,
    /// Replay starts in this journal file...
    pub replay_journal_seq: u64,
    /// ...with the frame numbered `replay_lsn` (frames before it are
    /// reflected in the runs)...
    pub replay_lsn: u64,
    /// ...whose round index (if a Round frame) is this: journal numbering
    /// goes on from here even when no journal file names it.
    pub replay_round: u64,
    pub created_ms: u64,
    /// Above every run sequence number this manifest names.
    pub next_run_seq: u64,
    /// Written by a clean shutdown: nothing follows in the journal.
    pub clean: bool,
    /// Newest first.
    pub runs: Vec<RunMeta>,
    /// Shared files small groups' records were in when the checkpoint was
    /// captured (`pins.rs`), as `FileId::raw` values, ascending: kept while
    /// this manifest is (journal files also before the replay position).
    pub pinned: Vec<u64>,
    /// No user had more groups than this in the checkpoint's state
    /// (`CursorTable::groups_per_user_high` when it was stored); `None`
    /// in a version 2 manifest.
    pub groups_per_user_bound: Option<u64>,
    /// No more groups than this in the checkpoint's state
    /// (`Catalog::len_high` when it was stored); `None` in a version 2
    /// manifest.
    pub groups_bound: Option<u64>,
    /// The runs hold a complete user index: an entry for every membership
    /// of the checkpoint's state (storage.md 6.1). `false` in a version 2
    /// or 3 manifest, and until a checkpoint after a full load wrote one.
    pub user_index: bool,
}

pub(crate) fn manifest_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("manifest")
}

pub(crate) fn manifest_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.tmm"))
}

fn parse_name(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".tmm")?;
    (stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()))
        .then(|| stem.parse().ok())
        .flatten()
}

/// Encodes a manifest; refuses one larger than [`MANIFEST_BYTES_MAX`].
pub(crate) fn encode(m: &Manifest) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    body.extend_from_slice(&m.ckpt_seq.to_le_bytes());
    body.extend_from_slice(&m.replay_journal_seq.to_le_bytes());
    body.extend_from_slice(&m.replay_lsn.to_le_bytes());
    body.extend_from_slice(&m.replay_round.to_le_bytes());
    body.extend_from_slice(&m.created_ms.to_le_bytes());
    body.extend_from_slice(&m.next_run_seq.to_le_bytes());
    body.push(u8::from(m.clean));
    body.extend_from_slice(&[0; 3]);
    let runs = u32::try_from(m.runs.len()).map_err(|_| "too many runs".to_string())?;
    body.extend_from_slice(&runs.to_le_bytes());
    for run in &m.runs {
        body.extend_from_slice(&run.run_seq.to_le_bytes());
        let parts = u32::try_from(run.parts.len()).map_err(|_| "too many parts".to_string())?;
        body.extend_from_slice(&parts.to_le_bytes());
        for p in &run.parts {
            body.extend_from_slice(&p.item_count.to_le_bytes());
            body.extend_from_slice(&p.file_len.to_le_bytes());
            body.extend_from_slice(&p.trailer_crc.to_le_bytes());
            put_key(&mut body, p.first_key);
            put_key(&mut body, p.last_key);
        }
    }
    let pinned = u32::try_from(m.pinned.len()).map_err(|_| "too many pinned files".to_string())?;
    body.extend_from_slice(&pinned.to_le_bytes());
    for seq in &m.pinned {
        body.extend_from_slice(&seq.to_le_bytes());
    }
    // A writer always knows them; `u64::MAX` stands for "unknown" (it
    // admits nothing before the load ends) should one not.
    for bound in [m.groups_per_user_bound, m.groups_bound] {
        body.extend_from_slice(&bound.unwrap_or(u64::MAX).to_le_bytes());
    }
    body.push(u8::from(m.user_index));
    let total = (MANIFEST_HEADER_BYTES + body.len()) as u64;
    if total > MANIFEST_BYTES_MAX {
        return Err(format!(
            "manifest of {total} bytes exceeds the limit of {MANIFEST_BYTES_MAX}"
        ));
    }
    let mut out = Vec::with_capacity(total as usize);
    out.extend_from_slice(&MANIFEST_MAGIC);
    out.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
    out.extend_from_slice(&(MANIFEST_HEADER_BYTES as u16).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    let header_crc = crc32fast::hash(&out[..28]);
    out.extend_from_slice(&header_crc.to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Decodes and checks a manifest.
pub(crate) fn decode(bytes: &[u8]) -> Result<Manifest, String> {
    if bytes.len() as u64 > MANIFEST_BYTES_MAX {
        return Err(format!(
            "manifest of {} bytes exceeds the limit",
            bytes.len()
        ));
    }
    if bytes.len() < MANIFEST_HEADER_BYTES {
        return Err(format!(
            "{} bytes is shorter than a manifest header",
            bytes.len()
        ));
    }
    let mut h = Reader::new(&bytes[..MANIFEST_HEADER_BYTES]);
    h.bytes(12)?;
    let reserved = h.u32()?;
    let body_len = h.u64()?;
    let body_crc = h.u32()?;
    // Versions 2 and 3 differ only by their missing last fields: checked
    // as they say.
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    let known = [
        MANIFEST_VERSION,
        MANIFEST_VERSION_UNINDEXED,
        MANIFEST_VERSION_UNBOUNDED,
    ];
    let read_as = if known.contains(&version) {
        version
    } else {
        MANIFEST_VERSION
    };
    let bounded = read_as != MANIFEST_VERSION_UNBOUNDED;
    let indexed = read_as == MANIFEST_VERSION;
    check_header(
        &bytes[..MANIFEST_HEADER_BYTES],
        "manifest",
        &MANIFEST_MAGIC,
        read_as,
        reserved == 0,
    )?;
    let body = &bytes[MANIFEST_HEADER_BYTES..];
    if body_len != body.len() as u64 {
        return Err(format!(
            "manifest body length {body_len} but {} bytes follow the header",
            body.len()
        ));
    }
    if crc32fast::hash(body) != body_crc {
        return Err("manifest body checksum mismatch".into());
    }
    let mut r = Reader::new(body);
    let ckpt_seq = r.u64()?;
    let replay_journal_seq = r.u64()?;
    let replay_lsn = r.u64()?;
    if replay_lsn > crate::commit::journal::LSN_MAX {
        return Err(format!(
            "manifest replay_lsn {replay_lsn} is at or beyond 2^62"
        ));
    }
    let replay_round = r.u64()?;
    let created_ms = r.u64()?;
    let next_run_seq = r.u64()?;
    let clean = match r.u8()? {
        0 => false,
        1 => true,
        v => return Err(format!("manifest clean flag {v}")),
    };
    if r.bytes(3)? != [0; 3] {
        return Err("manifest reserved bytes not zero".into());
    }
    let run_count = r.u32()?;
    if run_count as usize > r.remaining() / RUN_FIXED_BYTES {
        return Err(format!("{run_count} runs cannot fit the manifest"));
    }
    let mut runs: Vec<RunMeta> = Vec::with_capacity(run_count as usize);
    for _ in 0..run_count {
        let run_seq = r.u64()?;
        let part_count = r.u32()?;
        if part_count == 0 || part_count as usize > r.remaining() / PART_BYTES {
            return Err(format!("run {run_seq}: {part_count} parts"));
        }
        if run_seq >= next_run_seq || runs.iter().any(|x| x.run_seq == run_seq) {
            return Err(format!(
                "run {run_seq} named twice or not below next_run_seq"
            ));
        }
        let mut parts: Vec<PartMeta> = Vec::with_capacity(part_count as usize);
        for part in 0..part_count {
            let item_count = r.u64()?;
            let file_len = r.u64()?;
            let trailer_crc = r.u32()?;
            let first_key = read_key(&mut r)?;
            let last_key = read_key(&mut r)?;
            let min_len = (RUN_HEADER_BYTES + RUN_TRAILER_BYTES) as u64;
            if item_count == 0
                || !(min_len..=RUN_FILE_BYTES_READ_MAX).contains(&file_len)
                || first_key > last_key
                || parts.last().is_some_and(|p| p.last_key >= first_key)
            {
                return Err(format!(
                    "run {run_seq} part {part}: inconsistent description"
                ));
            }
            parts.push(PartMeta {
                run_seq,
                part,
                item_count,
                file_len,
                trailer_crc,
                first_key,
                last_key,
            });
        }
        runs.push(RunMeta { run_seq, parts });
    }
    let pinned_count = r.u32()?;
    if pinned_count as usize > r.remaining() / 8 {
        return Err(format!(
            "{pinned_count} pinned files cannot fit the manifest"
        ));
    }
    let mut pinned: Vec<u64> = Vec::with_capacity(pinned_count as usize);
    for _ in 0..pinned_count {
        // A journal file's seq (below 2^31), or 2^31 + a cold file's seq.
        let id = r.u64()?;
        let journal = id < 1 << 31;
        if id > u64::from(u32::MAX)
            || (journal && id >= replay_journal_seq)
            || pinned.last().is_some_and(|&p| p >= id)
        {
            return Err(format!(
                "pinned file {id} not ascending, not a file id, or a journal file not \
                 before the replay file"
            ));
        }
        pinned.push(id);
    }
    let mut bound = || -> Result<Option<u64>, String> {
        Ok(match bounded {
            true => Some(r.u64()?).filter(|&b| b != u64::MAX),
            false => None,
        })
    };
    let groups_per_user_bound = bound()?;
    let groups_bound = bound()?;
    let user_index = match indexed {
        false => false,
        true => match r.u8()? {
            0 => false,
            1 => true,
            v => return Err(format!("manifest user_index flag {v}")),
        },
    };
    if !r.is_empty() {
        return Err(format!(
            "{} bytes after the manifest's last field",
            r.remaining()
        ));
    }
    Ok(Manifest {
        ckpt_seq,
        replay_journal_seq,
        replay_lsn,
        replay_round,
        created_ms,
        next_run_seq,
        clean,
        runs,
        pinned,
        groups_per_user_bound,
        groups_bound,
        user_index,
    })
}

/// Manifest files in `dir` by sequence number, oldest first (other names
/// are ignored).
pub(crate) fn list(vfs: &dyn Vfs, dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out: Vec<(u64, PathBuf)> = vfs
        .read_dir(dir)
        .map_err(|e| Error::io(format!("list {}", dir.display()), e))?
        .into_iter()
        .filter_map(|p| {
            let seq = parse_name(p.file_name()?.to_str()?)?;
            Some((seq, p))
        })
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// Reads a manifest: `Err` for an I/O failure, `Ok(Err(reason))` for a
/// file that is not a valid manifest.
pub(crate) fn load(vfs: &dyn Vfs, path: &Path) -> Result<Result<Manifest, String>> {
    let file = vfs
        .open(path, OpenMode::Read)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    let len = file
        .file_len()
        .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
    if len > MANIFEST_BYTES_MAX {
        return Ok(Err(format!("manifest of {len} bytes exceeds the limit")));
    }
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, 0)
        .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    Ok(decode(&buf))
}

/// Writes manifest `m` as a new file and makes it durable (K6): create,
/// write, fdatasync, fsync of the directory. A stale file of the same name
/// (a torn earlier attempt) is replaced.
pub(crate) fn store(vfs: &dyn Vfs, dir: &Path, m: &Manifest) -> Result<PathBuf> {
    let bytes = encode(m).map_err(|reason| Error::WritesStopped { reason })?;
    let path = manifest_path(dir, m.ckpt_seq);
    let ctx = |op: &str| format!("{op} {}", path.display());
    let file = vfs
        .open(&path, OpenMode::ReadWriteCreate)
        .map_err(|e| Error::write(ctx("create"), e))?;
    file.set_len(0).map_err(|e| Error::io(ctx("truncate"), e))?;
    file.write_all_at(&bytes, 0)
        .map_err(|e| Error::write(ctx("write"), e))?;
    file.sync_data()
        .map_err(|e| Error::io(ctx("fdatasync"), e))?;
    vfs.sync_dir(dir)
        .map_err(|e| Error::io(format!("fsync dir {}", dir.display()), e))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Key;

    pub(crate) fn sample() -> Manifest {
        let part = |run_seq, part, first: Key, last: Key| PartMeta {
            run_seq,
            part,
            item_count: 3,
            file_len: 200,
            trailer_crc: 0xdead_beef,
            first_key: first,
            last_key: last,
        };
        Manifest {
            ckpt_seq: 9,
            replay_journal_seq: 4,
            replay_lsn: 77,
            replay_round: 70,
            created_ms: 1_700_000_000_000,
            next_run_seq: 12,
            clean: true,
            runs: vec![
                RunMeta {
                    run_seq: 11,
                    parts: vec![part(11, 0, Key::group(1), Key::member(1, 5))],
                },
                RunMeta {
                    run_seq: 7,
                    parts: vec![
                        part(7, 0, Key::group(1), Key::member(3, 2)),
                        part(7, 1, Key::group(4), Key::group(9)),
                    ],
                },
            ],
            pinned: vec![1, 3],
            groups_per_user_bound: Some(41),
            groups_bound: Some(40_000),
            user_index: true,
        }
    }

    /// `m` as a version 2 writer wrote it: without the bounds and the
    /// index flag.
    fn as_version_2(m: &Manifest) -> Vec<u8> {
        as_older(m, 17, MANIFEST_VERSION_UNBOUNDED)
    }

    /// `m` as an older writer wrote it: its last `cut` bytes left out and
    /// `version` in the header.
    fn as_older(m: &Manifest, cut: usize, version: u16) -> Vec<u8> {
        let mut bytes = encode(m).unwrap();
        bytes.truncate(bytes.len() - cut);
        with_version(bytes, version)
    }

    /// `bytes` with `version` in the header and its lengths and checksums
    /// made to match: only the version check can refuse it.
    fn with_version(mut bytes: Vec<u8>, version: u16) -> Vec<u8> {
        bytes[8..10].copy_from_slice(&version.to_le_bytes());
        let body = &bytes[MANIFEST_HEADER_BYTES..];
        let (body_len, body_crc) = (body.len() as u64, crc32fast::hash(body));
        bytes[16..24].copy_from_slice(&body_len.to_le_bytes());
        bytes[24..28].copy_from_slice(&body_crc.to_le_bytes());
        let header_crc = crc32fast::hash(&bytes[..28]);
        bytes[28..32].copy_from_slice(&header_crc.to_le_bytes());
        bytes
    }

    /// A directory written before the bounds existed still opens: its
    /// manifests read with the bounds unknown (every join and creation
    /// then waits for the whole state), and a version 3 reader does not
    /// take a version 2 file's last pinned entries for bounds, nor the
    /// reverse.
    #[test]
    fn a_version_2_manifest_reads_with_its_bound_unknown() {
        let m = sample();
        let old = as_version_2(&m);
        let read = decode(&old).unwrap();
        assert_eq!(
            read,
            Manifest {
                groups_per_user_bound: None,
                groups_bound: None,
                user_index: false,
                ..m.clone()
            }
        );
        // Version 2's length with version 4's number, and the reverse.
        let short = with_version(old.clone(), MANIFEST_VERSION);
        assert!(decode(&short).is_err());
        let long = with_version(encode(&m).unwrap(), MANIFEST_VERSION_UNBOUNDED);
        assert!(decode(&long).is_err());
        // Unknown also when a writer did not know it.
        let unknown = Manifest {
            groups_per_user_bound: None,
            groups_bound: None,
            ..m
        };
        assert_eq!(decode(&encode(&unknown).unwrap()).unwrap(), unknown);
    }

    /// A directory written before the user index existed still opens: its
    /// version 3 manifests read with the index incomplete (a user's groups
    /// are then known only after the whole load), and the lengths of
    /// versions 3 and 4 are not taken for each other; a flag other than 0
    /// and 1 is refused.
    #[test]
    fn a_version_3_manifest_reads_with_its_user_index_incomplete() {
        let m = sample();
        let old = as_older(&m, 1, MANIFEST_VERSION_UNINDEXED);
        assert_eq!(
            decode(&old).unwrap(),
            Manifest {
                user_index: false,
                ..m.clone()
            }
        );
        let short = with_version(old.clone(), MANIFEST_VERSION);
        assert!(decode(&short).is_err());
        let long = as_older(&m, 0, MANIFEST_VERSION_UNINDEXED);
        assert!(decode(&long).is_err());
        let mut two = encode(&m).unwrap();
        let at = two.len() - 1;
        two[at] = 2;
        let two = with_version(two, MANIFEST_VERSION);
        assert!(decode(&two).unwrap_err().contains("user_index"));
    }

    #[test]
    fn round_trip() {
        let m = sample();
        assert_eq!(decode(&encode(&m).unwrap()).unwrap(), m);
        let empty = Manifest {
            runs: vec![],
            ..sample()
        };
        assert_eq!(decode(&encode(&empty).unwrap()).unwrap(), empty);
    }

    #[test]
    fn every_flipped_bit_and_every_truncation_is_detected() {
        let bytes = encode(&sample()).unwrap();
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert!(decode(&b).is_err(), "byte {i} bit {bit}");
            }
        }
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err(), "truncated to {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
    }

    /// Re-encodes `m` with a valid header and CRC, so the field checks
    /// behind the checksums are what refuses it.
    fn refused(m: &Manifest) -> bool {
        decode(&encode(m).unwrap()).is_err()
    }

    #[test]
    fn descriptions_no_writer_makes_are_refused_behind_valid_checksums() {
        let mut m = sample();
        m.next_run_seq = 11; // run 11 not below it
        assert!(refused(&m));
        let mut m = sample();
        m.runs[1].run_seq = 11; // named twice
        m.runs[1].parts.iter_mut().for_each(|p| p.run_seq = 11);
        assert!(refused(&m));
        let mut m = sample();
        m.runs[1].parts[1].first_key = Key::member(3, 2); // overlaps part 0
        assert!(refused(&m));
        let mut m = sample();
        m.runs[0].parts[0].item_count = 0;
        assert!(refused(&m));
        let mut m = sample();
        m.runs[0].parts[0].file_len = RUN_FILE_BYTES_READ_MAX + 1;
        assert!(refused(&m));
        let mut m = sample();
        m.runs[0].parts[0].first_key = Key::group(2); // after its last key
        assert!(refused(&m));
        let mut m = sample();
        m.runs[0].parts.clear();
        assert!(refused(&m));
    }

    #[test]
    fn a_manifest_over_the_limit_is_neither_written_nor_read() {
        let parts_max = (MANIFEST_BYTES_MAX as usize) / PART_BYTES + 1;
        let part = |i: u64| PartMeta {
            run_seq: 1,
            part: i as u32,
            item_count: 1,
            file_len: 100,
            trailer_crc: 0,
            first_key: Key::group(i),
            last_key: Key::group(i),
        };
        let m = Manifest {
            next_run_seq: 2,
            runs: vec![RunMeta {
                run_seq: 1,
                parts: (0..parts_max as u64).map(part).collect(),
            }],
            ..sample()
        };
        assert!(encode(&m).is_err());
        let mut big = vec![0u8; MANIFEST_BYTES_MAX as usize + 1];
        big[..8].copy_from_slice(&MANIFEST_MAGIC);
        assert!(decode(&big).unwrap_err().contains("limit"));
    }

    #[test]
    fn file_names() {
        assert_eq!(
            manifest_path(Path::new("m"), 12),
            Path::new("m/00000000000000000012.tmm")
        );
        assert_eq!(parse_name("00000000000000000012.tmm"), Some(12));
        assert_eq!(parse_name("12.tmm"), None);
        assert_eq!(parse_name("0000000000000000001x.tmm"), None);
    }
}
