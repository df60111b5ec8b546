//! The checkpoint statistics (`EngineStats::checkpoint_bytes`,
//! `checkpoint_bytes_max`, `journal_bytes`): what the population benchmark
//! reads to report checkpoint bytes per journal byte.

use crate::{checkpoint, Config, Engine, FsyncPolicy, JoinStart};

#[test]
fn checkpoint_and_journal_bytes_count_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path());
    config.fsync = FsyncPolicy::Never;
    let e = Engine::open(config).unwrap();
    let s0 = e.stats();
    assert_eq!((s0.checkpoint_bytes, s0.checkpoint_bytes_max), (0, 0));

    e.create_group(1).unwrap();
    for i in 0..10 {
        e.append(1, 7, i + 1, &[0xab; 200]).unwrap();
    }
    let s1 = e.stats();
    // Ten records of 200 payload bytes went through the journal.
    assert!(
        s1.journal_bytes >= s0.journal_bytes + 10 * 200,
        "{} -> {}",
        s0.journal_bytes,
        s1.journal_bytes
    );

    e.checkpoint().unwrap();
    let first = std::fs::metadata(checkpoint::path(dir.path()))
        .unwrap()
        .len();
    let s2 = e.stats();
    assert_eq!(s2.checkpoints, s1.checkpoints + 1);
    assert_eq!(s2.checkpoint_bytes, s1.checkpoint_bytes + first);
    assert_eq!(s2.checkpoint_bytes_max, first);

    // A bigger state makes a bigger checkpoint: the maximum follows it.
    for g in 2..=200 {
        e.create_group(g).unwrap();
        e.join(g, 9, JoinStart::Head).unwrap();
    }
    e.checkpoint().unwrap();
    let second = std::fs::metadata(checkpoint::path(dir.path()))
        .unwrap()
        .len();
    assert!(second > first);
    let s3 = e.stats();
    assert_eq!(s3.checkpoint_bytes, s2.checkpoint_bytes + second);
    assert_eq!(s3.checkpoint_bytes_max, second);
    assert!(s3.journal_bytes > s2.journal_bytes);
}
