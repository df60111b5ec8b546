//! Routing of a reliable client's requests to the replica set that holds
//! their group (format-spec/protocol.md 4.33, cluster.md section 9).
//!
//! Representation: one [`Link`] per replica set, keyed by set id, and the
//! cluster map ([`ShardMap`]) once learned. Until then every request goes
//! to the link of key [`UNMAPPED`] (0), to the configured address: group
//! requests to a single node, or a replica set without a map file, never
//! ask for a map. The map is learned (CLUSTER_MAP) when a node answers
//! WRONG_SET, and before a request about a user (UNREAD, SYNC, an inbox's
//! subscription) that the client must fan out over every set: then only
//! if the node's STATS report `server.cluster_map_epoch` (CLUSTER_MAP is an
//! addition a client must not probe for, protocol.md section 7); a node
//! without it (too old to be part of a sharded cluster) is one set.
//!
//! When the map arrives, the link that asked (connected to a node of the
//! answering set) becomes that set's link; other sets' links are made on
//! first use, at the set's leader as the map names it or its first member,
//! with the set's other members to try (NOT_LEADER is followed per link,
//! as before).
//!
//! Invariants: a group's requests go to the link of `map.set_of(group)`
//! (or to `UNMAPPED` before a map); a set's link is never moved to another
//! set (its connection's generation would lie about what it holds).
//!
//! Costs: one multiply and one map lookup per request; a CLUSTER_MAP per
//! WRONG_SET followed (bounded per request by [`WRONG_SET_HOPS_MAX`]).

use std::collections::BTreeMap;
use std::time::Duration;

use super::error::{Ctx, Error};
use super::link::{Link, LinkStats};
use crate::client::{ClientConfig, ShardMap};

/// The link key of requests sent before a map is known, and of the one
/// set of a node without a map (its CLUSTER_MAP names set 0).
pub(crate) const UNMAPPED: u32 = 0;

/// The STATS name of nodes that answer CLUSTER_MAP (protocol.md 4.4.1).
const CLUSTER_MAP_STAT: &str = "server.cluster_map_epoch";

/// WRONG_SET answers one request follows before it gives up: the maps of
/// two nodes that disagree would otherwise bounce it for ever.
pub(crate) const WRONG_SET_HOPS_MAX: u32 = 3;

pub(crate) struct Router {
    /// The configured connection settings; other sets' links copy them
    /// with another address.
    base: ClientConfig,
    backoff_base: Duration,
    backoff_max: Duration,
    map: Option<ShardMap>,
    links: BTreeMap<u32, Link>,
    /// Map refreshes (CLUSTER_MAP asked after a WRONG_SET).
    refreshes: u64,
    /// The configured node does not know CLUSTER_MAP (BAD_FRAME): one set,
    /// never asked again.
    single: bool,
}

impl Router {
    pub(crate) fn new(
        base: ClientConfig,
        members: &[String],
        backoff_base: Duration,
        backoff_max: Duration,
    ) -> Router {
        let first = Link::new(base.clone(), backoff_base, backoff_max).with_members(members);
        Router {
            base,
            backoff_base,
            backoff_max,
            map: None,
            links: BTreeMap::from([(UNMAPPED, first)]),
            refreshes: 0,
            single: false,
        }
    }

    /// The map, when learned.
    pub(crate) fn map(&self) -> Option<&ShardMap> {
        self.map.as_ref()
    }

    /// The set a group's requests go to now.
    pub(crate) fn route(&self, group: u64) -> u32 {
        self.map.as_ref().map_or(UNMAPPED, |m| m.set_of(group))
    }

    /// The link of set `key`, made on first use (module docs).
    pub(crate) fn link(&mut self, key: u32) -> &mut Link {
        let (base, bb, bm) = (&self.base, self.backoff_base, self.backoff_max);
        let map = self.map.as_ref();
        self.links.entry(key).or_insert_with(|| {
            let set = map.and_then(|m| m.set(key));
            let members: Vec<String> = set
                .map(|s| s.members.iter().map(|(_, a)| a.clone()).collect())
                .unwrap_or_default();
            let first = set
                .and_then(|s| s.leader_addr().map(str::to_string))
                .or_else(|| members.first().cloned())
                .unwrap_or_else(|| base.addr.clone());
            let config = ClientConfig {
                addr: first,
                ..base.clone()
            };
            Link::new(config, bb, bm).with_members(&members)
        })
    }

    /// Every set's key, for a request a client fans out (UNREAD, SYNC):
    /// once the map is learned, the sets that own shards (never empty: a
    /// learned table assigns all 1024), whether or not the node listed
    /// their members.
    pub(crate) fn sets(&self) -> Vec<u32> {
        match &self.map {
            Some(m) => m.table.sets(),
            None => vec![UNMAPPED],
        }
    }

    /// Asks set `key`'s node for the map and routes by it from now on.
    /// Called only after a WRONG_SET or a STATS naming the map's epoch, so
    /// the node knows CLUSTER_MAP; should one still answer BAD_FRAME (a
    /// node replaced by an older one), it is taken for one set: the map
    /// stays unknown and everything goes on to `UNMAPPED`.
    pub(crate) fn learn(&mut self, key: u32, budget: Duration) -> Result<(), Error> {
        self.refreshes += 1;
        let asked = self
            .link(key)
            .call(budget, Ctx::default(), |c| c.cluster_map());
        match asked {
            Ok(map) => {
                self.adopt(key, map);
                Ok(())
            }
            Err(Error::BadFrame { .. }) => {
                self.single = true;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Routes by `map` from now on, which set `key`'s node answered.
    pub(crate) fn adopt(&mut self, key: u32, map: ShardMap) {
        // The asking link is connected to a node of the answering set.
        if key != map.set_id && !self.links.contains_key(&map.set_id) {
            if let Some(link) = self.links.remove(&key) {
                self.links.insert(map.set_id, link);
            }
        }
        if let Some(set) = map.set(map.set_id) {
            let members: Vec<String> = set.members.iter().map(|(_, a)| a.clone()).collect();
            if let Some(link) = self.links.get_mut(&map.set_id) {
                link.set_members(&members);
            }
        }
        self.map = Some(map);
    }

    /// Learns the map unless known: before a fan-out. CLUSTER_MAP is an
    /// addition (protocol.md section 7): the node is asked only when its
    /// STATS report `server.cluster_map_epoch`; a node without it is one set.
    pub(crate) fn ensure_map(&mut self, budget: Duration) -> Result<(), Error> {
        if self.map.is_some() || self.single {
            return Ok(());
        }
        let stats = self
            .link(UNMAPPED)
            .call(budget, Ctx::default(), |c| c.stats())?;
        if !stats.iter().any(|(name, _)| name == CLUSTER_MAP_STAT) {
            self.single = true;
            return Ok(());
        }
        self.learn(UNMAPPED, budget)
    }

    /// Runs a request about `group` on its set's link, following WRONG_SET
    /// (the map learned again from the refusing node) up to
    /// [`WRONG_SET_HOPS_MAX`] times; then, or when the map cannot be
    /// learned, the WRONG_SET is the answer.
    pub(crate) fn call<T>(
        &mut self,
        group: u64,
        budget: Duration,
        ctx: Ctx,
        mut op: impl FnMut(&mut crate::client::Client) -> Result<T, crate::ClientError>,
    ) -> Result<T, Error> {
        let mut hops = 0;
        loop {
            let key = self.route(group);
            match self.link(key).call(budget, ctx, &mut op) {
                Err(refused @ Error::WrongSet { .. }) if hops < WRONG_SET_HOPS_MAX => {
                    hops += 1;
                    // A map that cannot be learned leaves the refusal as
                    // the answer (nothing was done).
                    if self.learn(key, budget).is_err() {
                        return Err(refused);
                    }
                }
                r => return r,
            }
        }
    }

    /// Every link's counters added up; `redirects` counts WRONG_SET map
    /// refreshes too.
    pub(crate) fn stats(&self) -> LinkStats {
        let mut sum = LinkStats::default();
        for l in self.links.values() {
            let s = l.stats();
            sum.connects += s.connects;
            sum.reconnects += s.reconnects;
            sum.connect_failures += s.connect_failures;
            sum.broken += s.broken;
            sum.redirects += s.redirects;
        }
        sum.redirects += self.refreshes;
        sum
    }

    /// Sleeps a link's next backoff delay (`Link::pause`): false when that
    /// would pass `deadline`.
    pub(crate) fn pause(&mut self, deadline: std::time::Instant) -> bool {
        self.link(UNMAPPED).pause(deadline)
    }

    /// Closes every connection quietly.
    pub(crate) fn close_all(&mut self) {
        for l in self.links.values_mut() {
            l.close();
        }
    }

    /// Cuts every connection (fault injection).
    pub(crate) fn cut_all(&mut self) {
        for l in self.links.values_mut() {
            l.cut();
        }
    }
}
