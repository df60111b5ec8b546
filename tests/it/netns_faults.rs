//! Partitions of a replica set of three real nodes made the way a network
//! makes them: each member in a network namespace of its own, links cut
//! by packet-dropping rules (`netns.rs`; format-spec/cluster.md section
//! 6.1). Packets vanish without a reset, so a member sees connections
//! that stay open while nothing arrives, and TCP's retransmission backoff
//! after a heal, which the proxy links of `faulty_set.rs` do not show.
//!
//! - the leader cut from its peers while a client keeps sending to it:
//!   the same test as `cluster_faults.rs`, with DROP rules;
//! - what the leader sends to one follower dropped (one way), then what a
//!   follower sends to the leader, under load;
//! - a flapping partition under load: a member cut from its peers or from
//!   everything for 300 ms, healed for 200 ms, member after member;
//! - the history check of `history_check.rs` with this nemesis:
//!   partitions (the leader's first), one-way cuts, SIGKILL, SIGSTOP.
//!
//! Every test ends with every acknowledged send stored exactly once at
//! the id it was acknowledged with, ids dense, no member's process ended
//! by itself, and after a clean stop the members' `ctl dump`s and segment
//! files identical. Each needs root (it skips, saying so, without).
//!
//! Environment: `TIDEMARK_NETNS_ROUNDS=N` nemesis rounds of the history
//! check (default 8); `TIDEMARK_HISTORY_SEED` and
//! `TIDEMARK_HISTORY_CLIENTS` as in `history_check.rs`.

use std::time::{Duration, Instant};

use crate::cluster_faults::{
    check_log, leader, leader_cut_from_its_peers, settle_and_compare, setup, wait_follows, Ack,
    Writer, ANY,
};
use crate::faulty_set::{SetUnderFaults, IDS};
use crate::history_check::{self, Kind, Plan};
use crate::netns::NetnsSet;

/// The writer's pause after each acknowledged send, where a follower must
/// catch up under load: a follower applies one engine round (one
/// fdatasync) per committed entry, about the leader's own rate, so behind
/// an unpaced writer it catches up only once the load stops.
const PAUSE: Duration = Duration::from_millis(5);

/// The members' processes all ran throughout (a refused round restarts
/// a member in place, cluster.md section 5.1).
fn assert_no_exits(set: &impl SetUnderFaults) {
    let exits = set.exits();
    assert!(
        exits.iter().all(|&n| n == 0),
        "a member's process ended by itself (times per member: {exits:?})"
    );
}

/// The writer's acknowledgements checked against the log, then a clean
/// stop and the replicas compared.
fn check_and_compare(set: &mut NetnsSet, acks: &[Ack]) {
    set.supervise();
    assert_no_exits(set);
    let all: Vec<(u64, Ack)> = acks.iter().map(|&a| (ANY, a)).collect();
    let records = check_log(set, &all);
    settle_and_compare(set, records.len());
}

/// `cluster_faults.rs`'s partition test (the same body): the leader cut
/// from its peers by DROP rules while a client keeps sending to it.
#[test]
fn a_leader_cut_from_its_peers_by_drop_rules_acknowledges_nothing_more_and_rejoins_as_follower() {
    let Some(mut set) = NetnsSet::start("netns leader cut") else {
        return;
    };
    leader_cut_from_its_peers(&mut set);
}

/// The leader's packets to one follower dropped for 2 s under load (the
/// follower hears nothing, its pre-votes fail while the other follower
/// hears the leader), then a follower's packets to the leader: the set
/// keeps acknowledging, nothing acknowledged is lost.
#[test]
fn one_way_drops_between_leader_and_follower_lose_nothing_acknowledged() {
    let Some(mut set) = NetnsSet::start("netns one-way drops") else {
        return;
    };
    setup(&set, &[ANY]);
    let writer = Writer::start_paced(set.addrs(), PAUSE);
    writer.wait_more(&mut set, 20, None);
    for leader_sends in [true, false] {
        let lead = leader(&set);
        let follower = IDS.into_iter().find(|&i| i != lead).expect("a follower");
        let (from, to) = if leader_sends {
            (lead, follower)
        } else {
            (follower, lead)
        };
        set.cut_one_way(from, to);
        writer.wait_more(&mut set, 30, None);
        std::thread::sleep(Duration::from_secs(2));
        writer.wait_more(&mut set, 10, None);
        set.heal_all();
        writer.wait_more(&mut set, 20, None);
        eprintln!("one-way: {from} to {to} dropped for 2 s; leader then {lead}");
    }
    // Every member follows or leads again.
    for id in IDS {
        if id != leader(&set) {
            wait_follows(&mut set, id);
        }
    }
    let acks = writer.finish();
    eprintln!("one-way: {} sends acknowledged", acks.len());
    check_and_compare(&mut set, &acks);
}

/// Under load, member after member is cut for 300 ms and healed for
/// 200 ms, 10 times (from its peers, or from everything every other
/// time): elections may start and fail over and over; nothing
/// acknowledged is lost, ids stay dense, no process ends.
#[test]
fn a_flapping_partition_under_load_loses_nothing_acknowledged() {
    let Some(mut set) = NetnsSet::start("netns flapping partition") else {
        return;
    };
    setup(&set, &[ANY]);
    let writer = Writer::start(set.addrs());
    writer.wait_more(&mut set, 20, None);
    let before = writer.acks().len();
    for flap in 0..10 {
        let id = IDS[flap % IDS.len()];
        if flap % 2 == 0 {
            set.isolate(id);
        } else {
            set.net.isolate_completely(id);
        }
        std::thread::sleep(Duration::from_millis(300));
        set.heal_all();
        std::thread::sleep(Duration::from_millis(200));
        set.supervise();
    }
    let during = writer.acks().len() - before;
    writer.wait_more(&mut set, 20, None);
    let acks = writer.finish();
    eprintln!(
        "flapping: {} sends acknowledged, {during} during the 10 flaps",
        acks.len()
    );
    check_and_compare(&mut set, &acks);
}

/// `history_check.rs`'s history and checker with this nemesis.
#[test]
fn a_history_under_drop_rule_partitions_kills_and_pauses_is_consistent() {
    let Some(mut set) = NetnsSet::start("netns history check") else {
        return;
    };
    let plan = Plan::from_env(
        "TIDEMARK_NETNS_ROUNDS",
        8,
        &[Kind::Partition, Kind::OneWay, Kind::Kill, Kind::Pause],
    );
    history_check::run(&mut set, &plan);
}

/// The longest a set may take, from the heal of a silent partition, to
/// acknowledge a send that needs the member just healed: a Raft
/// connection whose frames stay unacknowledged is given up after
/// `FRAME_UNACKED_MAX` (2 s) and dialled again for the next frame
/// (format-spec/cluster.md section 7), plus an election's worth of slack.
/// Without that bound a member wrote into its old connection until TCP's
/// backoff retransmitted: 13 s after a 12 s cut.
const HEALED_SERVES_WITHIN: Duration = Duration::from_secs(5);

/// A follower cut from its peers by DROP rules for
/// `TIDEMARK_NETNS_SILENT_CUT_S` seconds (default 12) under load; at the
/// heal the other follower is cut instead, so the leader needs the one
/// just healed. Prints the time from the heal to the first send
/// acknowledged after it and asserts it is within
/// [`HEALED_SERVES_WITHIN`] (RELIABILITY.md "Replication in network
/// namespaces": without the transport's bound on unacknowledged frames it
/// grew with the length of the cut, since each member kept writing into
/// its connection that TCP was retransmitting on with backoff), and that
/// nothing acknowledged is lost.
#[test]
fn a_follower_back_from_a_silent_partition_makes_a_majority_again() {
    let Some(mut set) = NetnsSet::start("netns silent partition") else {
        return;
    };
    let hold = std::env::var("TIDEMARK_NETNS_SILENT_CUT_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    setup(&set, &[ANY]);
    let writer = Writer::start_paced(set.addrs(), PAUSE);
    writer.wait_more(&mut set, 20, None);
    let lead = leader(&set);
    let followers: Vec<u64> = IDS.into_iter().filter(|&i| i != lead).collect();
    let (back, other) = (followers[0], followers[1]);
    set.isolate(back);
    std::thread::sleep(Duration::from_secs(hold));
    writer.wait_more(&mut set, 10, Some(back));
    set.heal_all();
    let healed = Instant::now();
    set.isolate(other);
    let before = writer.acks().len();
    writer.wait_more(&mut set, 1, None);
    let first = writer.acks()[before].at.duration_since(healed);
    set.heal_all();
    writer.wait_more(&mut set, 20, None);
    let acks = writer.finish();
    eprintln!(
        "silent partition: follower {back} cut from its peers for {hold} s, then healed with follower {other} cut: first send acknowledged {:.0} ms after the heal ({} sends acknowledged in all)",
        first.as_secs_f64() * 1000.0,
        acks.len()
    );
    check_and_compare(&mut set, &acks);
    assert!(
        first <= HEALED_SERVES_WITHIN,
        "the set needed {first:?} after the heal to acknowledge a send (bound {HEALED_SERVES_WITHIN:?})"
    );
}
