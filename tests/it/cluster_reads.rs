//! A leader cut from its peers must not answer reads that a new leader's
//! writes made stale (format-spec/cluster.md section 5.2: reads confirmed
//! by a read index), against three real nodes (`faulty_set.rs`).
//!
//! Each attempt: the leader `L` answers an UNREAD (head `h`); `L`'s links
//! to its peers are cut (not its clients'); a send is acknowledged through
//! another member (a new leader, head `h + 1`); then `L` is asked UNREAD
//! on a connection opened before the cut, over and over until it refuses
//! or stops answering (it steps down within about two election timeouts).
//! Every answer it gives must show head `h + 1` or more: with a read
//! index it gives none (its heartbeats reach no majority; the read is
//! refused `NOT_LEADER` when it steps down). Without one it answers from
//! its engine, head `h`, for as long as it believes it leads, which
//! raft-rs's quorum check lets last up to two election timeouts, while a
//! follower starts an election after one to two: the attempts repeat so
//! that at least one meets that window.

use std::time::{Duration, Instant};

use tidemark_client::ClientError;
use tidemark_protocol::{ErrorCode, JoinStart};

use crate::faulty_set::{connect, on_leader, FaultySet, SetUnderFaults, IDS};

const GROUP: u64 = 21;
const USER: u64 = 7;
const ATTEMPTS: u64 = 4;

#[test]
fn a_leader_cut_from_its_peers_answers_no_read_a_new_leader_made_stale() {
    let mut set = FaultySet::start();
    let addrs = set.addrs();
    on_leader(&addrs, |c| c.create_group(GROUP));
    on_leader(&addrs, |c| c.join(GROUP, USER, JoinStart::Head));
    let mut stale_windows = 0;
    let mut refused = 0;
    for attempt in 0..ATTEMPTS {
        let (head, old) = on_leader(&addrs, |c| {
            c.send(GROUP, USER, 1000 + attempt, b"before")?;
            Ok(c.unread(USER)?[0].head)
        });
        let mut at_old = connect(&addrs[&old], Duration::from_secs(5)).expect("connect");
        set.isolate(old);
        // A send acknowledged by a new leader, among the others.
        let others: Vec<u64> = IDS.iter().copied().filter(|&i| i != old).collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        let new_head = 'sent: loop {
            for &id in &others {
                if let Some(mut c) = connect(&addrs[&id], Duration::from_secs(2)) {
                    if let Ok(s) = c.send(GROUP, USER, 2000 + attempt, b"after") {
                        break 'sent s.msg_id;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "no new leader acknowledged a send"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(new_head > head);
        // The old leader, asked until it refuses or stops answering.
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            match at_old.unread(USER) {
                Ok(list) => {
                    let seen = list[0].head;
                    assert!(
                        seen >= new_head,
                        "attempt {attempt}: node {old}, cut from its peers, answered head {seen} \
                         after node(s) {others:?} acknowledged msg {new_head}"
                    );
                    stale_windows += 1;
                }
                Err(ClientError::Server {
                    code: ErrorCode::NotLeader,
                    ..
                }) => {
                    refused += 1;
                    break;
                }
                Err(_) => break,
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        set.heal_all();
        set.supervise();
    }
    eprintln!(
        "cluster reads: {ATTEMPTS} cuts; the old leader refused a read (NOT_LEADER) {refused} times, \
         answered (fresh) {stale_windows} times"
    );
    set.stop_and_compare(&[GROUP]);
}
