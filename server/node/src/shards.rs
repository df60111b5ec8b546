//! The cluster map as a node serves it: which replica set owns each shard,
//! and the WRONG_SET check of every request that names a group
//! (format-spec/cluster.md section 9, protocol.md 4.33).
//!
//! Representation: [`ClusterShards`] holds the map the node was started
//! with (`serve --cluster-map`): its epoch, the node's own set, the shard
//! table (`ShardTable`: the owning set of each of the 1024 shards) and
//! every set's members with their client addresses. It never changes while
//! the node runs (moving shards is a later step), so the event loop reads
//! it without a lock.
//!
//! Invariants: a request is refused with WRONG_SET before anything of it is
//! done, so a refused request may be sent again, as it is, to the named
//! set; every request kind is decided in [`ClusterShards::foreign`] (an
//! exhaustive match: a new request must say whether it names groups).
//! Requests naming many groups (BATCH_ACK, SUBSCRIBE GROUPS,
//! SUBSCRIBE_RECEIPTS) are refused whole when one of their groups is
//! another set's; requests naming a user (UNREAD, SYNC, SUBSCRIBE USER) are
//! answered for the groups this set holds (the client library fans out).
//!
//! Costs: per request one multiply and one array index per group it names
//! (O(items) for BATCH_ACK and the subscriptions, which cost that anyway).

use tidemark_protocol::{shard, Request, ShardTable, Subscription};

/// One replica set of the map: its id and members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetMembers {
    pub set_id: u32,
    /// `(node id, client address)`, by ascending node id.
    pub members: Vec<(u64, String)>,
}

/// The cluster map of a node started with one (module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterShards {
    pub epoch: u64,
    /// The set this node is a member of.
    pub own_set: u32,
    pub table: ShardTable,
    /// Every set of the map by ascending id, `own_set` included.
    pub sets: Vec<SetMembers>,
}

/// A request for another set's group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrongSet {
    /// The first group of the request that is not this set's.
    pub group: u64,
    /// The set that owns it.
    pub set_id: u32,
}

impl ClusterShards {
    /// The first group the request names that another set owns, with that
    /// set; `None` when every group it names is this set's, or it names
    /// none (module docs: what each request kind names).
    pub fn foreign(&self, req: &Request<'_>) -> Option<WrongSet> {
        let check = |group: u64| {
            let set_id = self.table.set_of(group);
            (set_id != self.own_set).then_some(WrongSet { group, set_id })
        };
        match req {
            Request::CreateGroup { group }
            | Request::DeleteGroup { group }
            | Request::Join { group, .. }
            | Request::Leave { group, .. }
            | Request::SetRetention { group, .. }
            | Request::ClearHistory { group, .. }
            | Request::Send { group, .. }
            | Request::Recall { group, .. }
            | Request::Edit { group, .. }
            | Request::Pull { group, .. }
            | Request::Ack { group, .. }
            | Request::History { group, .. }
            | Request::HistoryLatest { group, .. }
            | Request::ReadCount { group, .. }
            | Request::Members { group, .. }
            | Request::GroupInfo { group }
            | Request::Readers { group, .. } => check(*group),
            // Refused whole (no cursor moves) when one item is another
            // set's: a partial answer would need a per-item status a
            // version 1 client does not know, and the client library splits
            // a batch by set before it sends it (protocol.md 4.33).
            Request::BatchAck { items, .. } => items.iter().find_map(|i| check(i.group)),
            // As for an unknown group: all groups or nothing is added.
            Request::Subscribe(Subscription::Groups(groups))
            | Request::SubscribeReceipts { groups, .. } => groups.iter().copied().find_map(check),
            // A user's groups: each set answers for those it holds.
            Request::Subscribe(Subscription::User(_))
            | Request::Unread { .. }
            | Request::Sync { .. } => None,
            // The connection and the node itself.
            Request::Hello { .. }
            | Request::Auth { .. }
            | Request::Ping
            | Request::Stats
            | Request::Backup
            | Request::Info
            | Request::Cluster
            | Request::ClusterMap
            | Request::ClusterChange(_)
            | Request::SlowLog { .. }
            | Request::Unsubscribe => None,
        }
    }

    /// The members of set `set_id` (empty when the map has no such set,
    /// which a checked map never lacks for a set its table names).
    pub fn members(&self, set_id: u32) -> &[(u64, String)] {
        self.sets
            .iter()
            .find(|s| s.set_id == set_id)
            .map_or(&[][..], |s| &s.members[..])
    }

    /// The WRONG_SET message: the group, its shard and set, and where that
    /// set's clients connect. For humans: clients MUST NOT parse it.
    pub fn message(&self, wrong: &WrongSet) -> String {
        let addrs: Vec<&str> = self
            .members(wrong.set_id)
            .iter()
            .map(|(_, a)| a.as_str())
            .collect();
        format!(
            "wrong set: group {} (shard {}) is held by set {}; its members' client addresses are {}",
            wrong.group,
            shard(wrong.group),
            wrong.set_id,
            addrs.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_protocol::{AckItem, ShardRange};

    fn two_sets() -> ClusterShards {
        let range = |first, last, set_id| ShardRange {
            first,
            last,
            set_id,
        };
        ClusterShards {
            epoch: 3,
            own_set: 1,
            table: ShardTable::from_ranges(&[range(0, 511, 1), range(512, 1023, 2)])
                .expect("a valid table"),
            sets: vec![
                SetMembers {
                    set_id: 1,
                    members: vec![(1, "127.0.0.1:7001".into())],
                },
                SetMembers {
                    set_id: 2,
                    members: vec![(4, "127.0.0.1:7004".into())],
                },
            ],
        }
    }

    // shard(1) = 632 (set 2), shard(2) = 241 (set 1): cluster.md's vectors.
    const FOREIGN: u64 = 1;
    const OWN: u64 = 2;

    #[test]
    fn a_request_naming_another_sets_group_is_foreign_and_the_message_names_it() {
        let map = two_sets();
        let wrong = map.foreign(&Request::Send {
            group: FOREIGN,
            sender: 1,
            client_msg_id: 1,
            payload: b"x",
        });
        assert_eq!(
            wrong,
            Some(WrongSet {
                group: FOREIGN,
                set_id: 2
            })
        );
        assert_eq!(
            map.message(&wrong.unwrap_or(WrongSet {
                group: 0,
                set_id: 0
            })),
            "wrong set: group 1 (shard 632) is held by set 2; its members' client addresses \
             are 127.0.0.1:7004",
            "the message of the error_wrong_set.hex vector"
        );
        assert_eq!(map.foreign(&Request::GroupInfo { group: OWN }), None);
        assert_eq!(map.foreign(&Request::CreateGroup { group: OWN }), None);
    }

    #[test]
    fn a_batch_spanning_sets_is_refused_whole_and_user_requests_pass() {
        let map = two_sets();
        let item = |group| AckItem { group, msg_id: 1 };
        let batch = Request::BatchAck {
            user: 5,
            items: vec![item(OWN), item(FOREIGN)],
        };
        assert_eq!(map.foreign(&batch).map(|w| w.set_id), Some(2));
        let own_batch = Request::BatchAck {
            user: 5,
            items: vec![item(OWN), item(OWN)],
        };
        assert_eq!(map.foreign(&own_batch), None);
        let subscribe = Request::Subscribe(Subscription::Groups(vec![OWN, FOREIGN]));
        assert_eq!(map.foreign(&subscribe).map(|w| w.group), Some(FOREIGN));
        for user_level in [
            Request::Unread { user: 5 },
            Request::Subscribe(Subscription::User(5)),
            Request::ClusterMap,
        ] {
            assert_eq!(map.foreign(&user_level), None, "{user_level:?}");
        }
    }
}
