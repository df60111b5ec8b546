//! CLUSTER_MAP and WRONG_SET at the handlers (format-spec/protocol.md
//! 4.33): the map a node answers, and the refusal of a request for a
//! group of another set.

use std::time::Duration;

use tidemark_engine::{Config, Engine};

use crate::config::{ClusterView, Leadership, Limits, NotLeader};
use crate::connection::Connection;
use crate::handlers::action::Action;
use crate::handlers::context::Ctx;
use crate::receipts::Receipts;
use crate::shards::{ClusterShards, SetMembers};
use crate::subscriptions::Subscriptions;
use tidemark_protocol::{
    decode_response, ErrorCode, Frame, Request, Response, ShardRange, ShardTable,
};

/// Node 2 of a replica set led by node 1, refusing data requests.
struct Follower;

impl Leadership for Follower {
    // Never asked: a follower refuses every data request first.
    fn read_ticket(&self) -> u64 {
        0
    }
    fn read_outcome(&self, _ticket: u64) -> Option<bool> {
        Some(false)
    }
    fn on_reads(&self, _wake: std::sync::Arc<dyn Fn() + Send + Sync>) {}
    fn raft_figures(&self) -> Option<crate::config::RaftFigures> {
        None
    }
    fn refusal(&self) -> Option<NotLeader> {
        Some(NotLeader {
            leader: Some(1),
            client_addr: Some("127.0.0.1:7001".into()),
            starting: false,
        })
    }
    fn map(&self) -> ClusterView {
        ClusterView {
            node_id: 2,
            leader_id: 1,
            members: vec![(1, "127.0.0.1:7001".into()), (2, "127.0.0.1:7002".into())],
        }
    }
    fn change(&self, _: crate::config::ChangeRequest, done: crate::config::ChangeDone) {
        done(crate::config::ChangeOutcome::NotLeader(NotLeader {
            leader: Some(1),
            client_addr: Some("127.0.0.1:7001".into()),
            starting: false,
        }))
    }
}

fn two_sets() -> ClusterShards {
    let range = |first, last, set_id| ShardRange {
        first,
        last,
        set_id,
    };
    ClusterShards {
        epoch: 3,
        own_set: 1,
        table: ShardTable::from_ranges(&[range(0, 511, 1), range(512, 1023, 2)]).unwrap(),
        sets: vec![
            SetMembers {
                set_id: 1,
                members: vec![(1, "127.0.0.1:7001".into()), (2, "127.0.0.1:7002".into())],
            },
            SetMembers {
                set_id: 2,
                members: vec![(4, "127.0.0.1:7004".into())],
            },
        ],
    }
}

/// The answer of a READY connection to `req`, with the given gates.
fn answer(
    e: &Engine,
    leadership: Option<&dyn Leadership>,
    shards: Option<&ClusterShards>,
    req: Request<'_>,
) -> Vec<u8> {
    let limits = Limits::default();
    let mut subs = Subscriptions::default();
    let mut receipts = Receipts::new(Duration::ZERO, usize::MAX, limits.frame_bytes_max);
    let mut ctx = Ctx {
        leadership,
        shards,
        ..Ctx::for_tests(e, &limits, &mut subs, &mut receipts)
    };
    let mut conn = Connection::ready(limits.frame_bytes_max);
    match conn.handle_request(&mut ctx, 9, req) {
        Ok(Action::Answer(out)) => out.head,
        _ => panic!("not answered at once"),
    }
}

/// A CLUSTER_MAP answer in short: epoch, node, set, (set, leader,
/// members) per set, and the number of shard ranges.
type MapSummary = (u64, u64, u32, Vec<(u32, u64, usize)>, usize);

fn map_of(frame: &[u8]) -> MapSummary {
    match decode_response(&Frame::parse(frame).unwrap()).unwrap() {
        Response::ClusterMap(m) => (
            m.epoch,
            m.node_id,
            m.set_id,
            m.sets
                .iter()
                .map(|s| (s.set_id, s.leader_id, s.members.len()))
                .collect(),
            m.ranges.len(),
        ),
        other => panic!("not a CLUSTER_MAP: {other:?}"),
    }
}

/// CLUSTER_CHANGE (4.34): a follower refuses it with NOT_LEADER at its
/// gate; a single node with MEMBERSHIP_REFUSED, detail 4.
#[test]
fn cluster_change_is_refused_at_a_follower_and_on_a_single_node() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(Config::new(dir.path())).unwrap();
    let change = || Request::ClusterChange(tidemark_protocol::MemberChange::Remove { node_id: 3 });
    let code_of = |frame: Vec<u8>| match decode_response(&Frame::parse(&frame).unwrap()) {
        Ok(Response::Error(err)) => (err.code, err.detail),
        other => panic!("not an ERROR: {other:?}"),
    };
    assert_eq!(
        code_of(answer(&e, Some(&Follower), None, change())),
        (ErrorCode::NotLeader, Some(1))
    );
    assert_eq!(
        code_of(answer(&e, None, None, change())),
        (ErrorCode::MembershipRefused, Some(4))
    );
}

#[test]
fn every_kind_of_node_answers_cluster_map_and_a_follower_too() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(Config::new(dir.path())).unwrap();
    // A single node: one set, no members, every shard.
    let single = answer(&e, None, None, Request::ClusterMap);
    assert_eq!(map_of(&single), (0, 0, 0, vec![(0, 0, 0)], 1));
    // A replica set without a map, asked at a follower: set 0 with
    // its members and leader.
    let set = answer(&e, Some(&Follower), None, Request::ClusterMap);
    assert_eq!(map_of(&set), (0, 2, 0, vec![(0, 1, 2)], 1));
    // With a map: its sets, the own set's leader, the others' unknown.
    let map = two_sets();
    let sharded = answer(&e, Some(&Follower), Some(&map), Request::ClusterMap);
    assert_eq!(map_of(&sharded), (3, 2, 1, vec![(1, 1, 2), (2, 0, 1)], 2));
}

#[test]
fn wrong_set_comes_before_not_leader_and_own_groups_meet_the_leader_gate() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(Config::new(dir.path())).unwrap();
    let map = two_sets();
    let code = |frame: &[u8]| match decode_response(&Frame::parse(frame).unwrap()).unwrap() {
        Response::Error(err) => (err.code, err.detail),
        other => panic!("not an ERROR: {other:?}"),
    };
    // shard(1) = 632 (set 2), shard(2) = 241 (set 1).
    let foreign = answer(
        &e,
        Some(&Follower),
        Some(&map),
        Request::GroupInfo { group: 1 },
    );
    assert_eq!(code(&foreign), (ErrorCode::WrongSet, Some(2)));
    let own = answer(
        &e,
        Some(&Follower),
        Some(&map),
        Request::GroupInfo { group: 2 },
    );
    assert_eq!(code(&own), (ErrorCode::NotLeader, Some(1)));
    // Refused before anything is done: the group was not created.
    let create = answer(&e, None, Some(&map), Request::CreateGroup { group: 1 });
    assert_eq!(code(&create), (ErrorCode::WrongSet, Some(2)));
    assert!(e.head(1).is_err(), "nothing of a refused request is done");
}
