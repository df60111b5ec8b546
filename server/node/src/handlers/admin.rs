//! Administration and the cluster: STATS, INFO and SLOWLOG (answered with
//! what the loop holds), SET_RETENTION and CLEAR_HISTORY, and a replica
//! set's and a cluster's requests and refusals (CLUSTER, CLUSTER_MAP,
//! CLUSTER_CHANGE's answer, NOT_LEADER, WRONG_SET).

use tidemark_engine::Error as EngineError;

use crate::handlers::action::{Action, OpKind, Parked};
use crate::handlers::context::Ctx;
use crate::outgoing::{error, reply, Outgoing};
use crate::slowlog::SlowLog;
use tidemark_protocol::{
    ErrorCode, MemberChange, Response, RetentionPolicy, Stat, FRAME_HEADER_BYTES,
};

/// CLUSTER (4.32): the replica set as this node knows it; a single node
/// answers node id 0, no leader, no members. Served by every member.
pub fn cluster(ctx: &Ctx<'_>, request_id: u64) -> Outgoing {
    let view = ctx.leadership.map(|l| l.map());
    let (node_id, leader_id, members) = match &view {
        Some(v) => (v.node_id, v.leader_id, &v.members[..]),
        None => (0, 0, &[][..]),
    };
    let map = tidemark_protocol::ClusterMap {
        node_id,
        leader_id,
        members: members
            .iter()
            .map(|(id, addr)| tidemark_protocol::ClusterMember {
                node_id: *id,
                client_addr: addr,
            })
            .collect(),
    };
    reply(request_id, &Response::Cluster(map), Vec::new(), 0)
}

/// CLUSTER_CHANGE (4.34): the change for the replica set's leadership,
/// which the loop hands it; a single node has no membership to change and
/// refuses it MEMBERSHIP_REFUSED.
pub fn begin_cluster_change(ctx: &Ctx<'_>, request_id: u64, change: MemberChange<'_>) -> Action {
    if ctx.leadership.is_none() {
        return Action::Answer(error(
            request_id,
            ErrorCode::MembershipRefused,
            Some(4),
            "not a replica set member: a single node has no membership to change",
        ));
    }
    Action::ClusterChange(match change {
        MemberChange::Add {
            node_id,
            cluster_addr,
            client_addr,
        } => crate::config::ChangeRequest::Add {
            node_id,
            cluster_addr: cluster_addr.to_string(),
            client_addr: client_addr.to_string(),
        },
        MemberChange::Remove { node_id } => crate::config::ChangeRequest::Remove { node_id },
    })
}

/// CLUSTER_CHANGE's answer (4.34): the membership once the change
/// applied, NOT_LEADER, or MEMBERSHIP_REFUSED.
pub fn cluster_change(request_id: u64, outcome: &crate::config::ChangeOutcome) -> Outgoing {
    use crate::config::ChangeOutcome;
    match outcome {
        ChangeOutcome::Done(v) => {
            let map = tidemark_protocol::ClusterMap {
                node_id: v.node_id,
                leader_id: v.leader_id,
                members: v
                    .members
                    .iter()
                    .map(|(id, addr)| tidemark_protocol::ClusterMember {
                        node_id: *id,
                        client_addr: addr,
                    })
                    .collect(),
            };
            reply(request_id, &Response::ClusterChange(map), Vec::new(), 0)
        }
        ChangeOutcome::NotLeader(n) => not_leader(request_id, n),
        ChangeOutcome::Refused { detail, message } => error(
            request_id,
            ErrorCode::MembershipRefused,
            Some(*detail),
            message,
        ),
    }
}

/// CLUSTER_MAP (4.33): the cluster's sets and shard table as this node
/// knows them, its own set's leader from its replica. Without a map file:
/// one set (id 0, epoch 0) owning every shard, whose members are the
/// replica set's (none on a single node: the node asked is the set).
/// Served by every member. Cost: the map copied (1024 shards walked into
/// ranges); a rare request.
pub fn cluster_map(ctx: &Ctx<'_>, request_id: u64) -> Outgoing {
    use tidemark_protocol::{ClusterMember, ReplicaSetEntry, ShardMap, ShardTable, SHARD_COUNT};
    let view = ctx.leadership.map(|l| l.map());
    let (node_id, own_leader) = view.as_ref().map_or((0, 0), |v| (v.node_id, v.leader_id));
    fn members(list: &[(u64, String)]) -> Vec<ClusterMember<'_>> {
        list.iter()
            .map(|(id, addr)| ClusterMember {
                node_id: *id,
                client_addr: addr,
            })
            .collect()
    }
    let single;
    let (epoch, own_set, table, sets) = match ctx.shards {
        Some(map) => (
            map.epoch,
            map.own_set,
            &map.table,
            map.sets
                .iter()
                .map(|s| ReplicaSetEntry {
                    set_id: s.set_id,
                    // Other sets' leaders: not learned in this version.
                    leader_id: if s.set_id == map.own_set {
                        own_leader
                    } else {
                        0
                    },
                    members: members(&s.members),
                })
                .collect(),
        ),
        None => {
            single = ShardTable::single(0);
            let set = ReplicaSetEntry {
                set_id: 0,
                leader_id: own_leader,
                members: view.as_ref().map_or_else(Vec::new, |v| members(&v.members)),
            };
            (0, 0, &single, vec![set])
        }
    };
    let map = ShardMap {
        epoch,
        node_id,
        set_id: own_set,
        shard_count: SHARD_COUNT,
        sets,
        ranges: table.ranges(),
    };
    reply(request_id, &Response::ClusterMap(map), Vec::new(), 0)
}

/// WRONG_SET (4.33): the request names a group of another set; detail the
/// set's id, the message its members' client addresses.
pub fn wrong_set(
    request_id: u64,
    map: &crate::shards::ClusterShards,
    wrong: &crate::shards::WrongSet,
) -> Outgoing {
    error(
        request_id,
        ErrorCode::WrongSet,
        Some(u64::from(wrong.set_id)),
        &map.message(wrong),
    )
}

/// NOT_LEADER (format-spec/protocol.md 4.31): detail the leader's node id
/// when known, the message naming its client address.
pub fn not_leader(request_id: u64, refusal: &crate::config::NotLeader) -> Outgoing {
    let message = match (refusal.leader, &refusal.client_addr) {
        (Some(id), _) if refusal.starting => {
            format!("not the leader yet: node {id} was elected and is catching up; retry")
        }
        (Some(id), Some(addr)) => {
            format!("not the leader: node {id} leads, its clients' address is {addr}")
        }
        (Some(id), None) => format!("not the leader: node {id} leads"),
        (None, _) => "not the leader: no leader is known (an election is under way)".into(),
    };
    error(request_id, ErrorCode::NotLeader, refusal.leader, &message)
}

/// SET_RETENTION (4.26): parked until the policy is durable.
pub fn set_retention(
    ctx: &Ctx<'_>,
    group: u64,
    policy: RetentionPolicy,
) -> Result<Action, EngineError> {
    let ticket = ctx.engine.try_submit_set_retention(
        group,
        tidemark_engine::Retention {
            by_cursor: policy.by_cursor,
            max_age_ms: policy.max_age_ms,
            max_bytes: policy.max_bytes,
        },
    )?;
    Ok(Action::Park(Parked::Op(ticket, OpKind::SetRetention)))
}

/// CLEAR_HISTORY (4.27): parked until the clear is durable.
pub fn clear_history(
    ctx: &Ctx<'_>,
    group: u64,
    user: u64,
    up_to: u64,
) -> Result<Action, EngineError> {
    let ticket = ctx.engine.try_submit_clear_history(group, user, up_to)?;
    Ok(Action::Park(Parked::Op(
        ticket,
        OpKind::ClearHistory { group, user },
    )))
}

/// STATS (4.4): the node's figures, as `Stats::report` lists them.
///
/// The answer always fits `frame_bytes_max` (format-spec/protocol.md
/// 4.4): the `limits.*` and `server.*` names come first (they fit the
/// smallest legal frame, `FRAME_BYTES_MAX_FLOOR`: a client can always
/// read the limits it runs under), then the others in report order while
/// they fit; `server.stats_omitted` says how many were left out.
pub fn stats(request_id: u64, figures: &[(String, u64)], frame_bytes_max: u32) -> Outgoing {
    let first = |name: &str| name.starts_with("limits.") || name.starts_with("server.");
    let ordered = figures
        .iter()
        .filter(|(name, _)| first(name))
        .chain(figures.iter().filter(|(name, _)| !first(name)));
    // The length prefix, the header and the list's count, then per name
    // its string and its value.
    let entry_bytes = |name: &str| 4 + name.len() + 8;
    let room = (frame_bytes_max as usize + 4).saturating_sub(FRAME_HEADER_BYTES + 4);
    let mut used = 0;
    let mut omitted = 0u64;
    let mut list: Vec<Stat<'_>> = Vec::with_capacity(figures.len());
    for (name, value) in ordered {
        if used + entry_bytes(name) > room && !first(name) {
            omitted += 1;
            continue;
        }
        used += entry_bytes(name);
        list.push(Stat {
            name,
            value: *value,
        });
    }
    if let Some(s) = list.iter_mut().find(|s| s.name == "server.stats_omitted") {
        s.value = omitted;
    }
    reply(request_id, &Response::Stats(list), Vec::new(), 0)
}

/// INFO (format-spec/protocol.md 4.24): the node's text figures.
pub fn info(request_id: u64, items: &[(String, String)]) -> Outgoing {
    let list: Vec<tidemark_protocol::InfoItem<'_>> = items
        .iter()
        .map(|(name, value)| tidemark_protocol::InfoItem { name, value })
        .collect();
    reply(request_id, &Response::Info(list), Vec::new(), 0)
}

/// SLOWLOG (format-spec/protocol.md 4.25): up to `max_count` entries,
/// newest first, as many as fit `frame_bytes_max`; with `reset`, the log
/// is emptied once they are listed (entries that did not fit are dropped
/// too: `held` says how many there were). Costs the entries listed.
pub fn slowlog(
    request_id: u64,
    log: &mut SlowLog,
    reset: bool,
    max_count: u32,
    frame_bytes_max: u32,
) -> Outgoing {
    let texts: Vec<(String, String)> = log
        .newest_first()
        .take(max_count as usize)
        .map(|e| (e.client.to_string(), e.args.text()))
        .collect();
    let mut room = (frame_bytes_max as usize + 4)
        .saturating_sub(tidemark_protocol::SLOW_LOG_RESPONSE_FIXED_BYTES);
    let mut entries = Vec::with_capacity(texts.len());
    for (e, (client, args)) in log.newest_first().zip(&texts) {
        let size = tidemark_protocol::SLOW_LOG_ENTRY_BYTES_MIN + client.len() + args.len();
        if size > room {
            break;
        }
        room -= size;
        entries.push(tidemark_protocol::SlowLogEntry {
            id: e.id,
            unix_ms: e.unix_ms,
            duration_ns: e.duration.as_nanos().min(u128::from(u64::MAX)) as u64,
            opcode: e.op.request_byte(),
            client,
            args,
        });
    }
    let resp = Response::SlowLog(tidemark_protocol::SlowLog {
        threshold_us: log.threshold_us(),
        entries_max: u32::try_from(log.entries_max()).unwrap_or(u32::MAX),
        held: u32::try_from(log.len()).unwrap_or(u32::MAX),
        recorded: log.recorded(),
        entries,
    });
    let out = reply(request_id, &resp, Vec::new(), 0);
    if reset {
        log.reset();
    }
    out
}
