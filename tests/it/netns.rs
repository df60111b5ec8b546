//! A replica set of three real `tidemark serve --cluster-*` processes,
//! each in a network namespace of its own, whose links are cut by
//! packet-dropping rules: the fixture of `netns_faults.rs`
//! (format-spec/cluster.md section 6.1). Where `faulty_set.rs` cuts a TCP
//! forwarder (connections broken, new ones refused), here packets vanish
//! on the way as in a real partition: no reset, no error, a connection
//! that stays open with nothing arriving, TCP retransmitting with backoff.
//!
//! **Topology**, per set: a *hub* namespace holding a bridge `br0`
//! (198.18.0.1/24) and one namespace per member, whose `eth0`
//! (198.18.0.`10 + id`/24) is a veth pair with a port of the bridge. The
//! addresses are from 198.18.0.0/15, the range RFC 2544 sets aside for
//! benchmarking: no real network uses it. The test's own thread enters
//! the hub namespace (setns(2) moves only the calling thread; threads it
//! spawns afterwards start there too), so its clients reach each member
//! at `198.18.0.<10 + id>:7100` and nothing is added to the root
//! namespace: no interface, route or rule, and no packet can leave the
//! machine (the hub's only link is the bridge). Every set has the same
//! addresses, each in namespaces of its own, so sets of tests running at
//! the same time never meet.
//!
//! **Faults** are iptables `DROP` rules on the *receiving* side's INPUT
//! chain, so the sender's stack sees nothing (a `DROP` in OUTPUT would
//! answer the sender's own writes with `EPERM`, which no network does):
//! [`Net::isolate`] cuts a member from its peers both ways (its clients
//! still reach it), [`Net::isolate_completely`] from its clients too,
//! [`Net::drop_one_way`] drops what `from` sends to `to` while `to`'s
//! packets to `from` pass (over TCP that means `from`'s frames to `to`
//! never arrive, and `to`'s frames to `from` arrive but are never
//! acknowledged, so its connection stalls once its window is full), and
//! [`Net::heal_all`] flushes every rule.
//!
//! **Prerequisites**: root, `ip` and `iptables`, and `ip netns add`
//! working (`.ci/run` installs the tools). Without them
//! [`NetnsSet::start`] prints `SKIPPED: <test>: <why>` on standard error
//! (straight to the file descriptor, past the test harness's capture) and
//! returns `None`; the test returns without checking anything.
//!
//! **Names** are `tmnet-<pid>-<n>-hub` and `tmnet-<pid>-<n>-<id>` (the
//! test process's pid and a counter; interface names are the same short
//! ones in every namespace). Teardown is [`Net`]'s `Drop`, also on a
//! panic: the members are killed first ([`NetnsSet`]'s field order), then
//! the namespaces are deleted, which deletes their veths and the bridge.
//! At first use the namespaces of this prefix whose pid is no longer a
//! process (a test run killed before its teardown) are swept: their
//! processes killed, the namespaces deleted.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::faulty_set::{SetUnderFaults, IDS};
use crate::harness::{tidemark_bin, ReplicaMember};

/// Every namespace these tests create starts with this.
const PREFIX: &str = "tmnet-";
/// The hub's address: where the test's clients connect from.
const HUB_ADDR: &str = "198.18.0.1";
/// Each member's client and cluster port (each member has its own
/// addresses, so the ports are the same for all).
const CLIENT_PORT: u16 = 7100;
const CLUSTER_PORT: u16 = 7200;

/// Member `id`'s address.
pub fn member_addr(id: u64) -> String {
    format!("198.18.0.{}", 10 + id)
}

/// Runs `args` (a program and its arguments); its standard error on
/// failure.
fn run(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}: {}, {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `args` and panics on failure: a step of a topology the
/// prerequisites said would work.
fn must(args: &[&str]) {
    if let Err(e) = run(args) {
        panic!("{e}");
    }
}

/// Whether the prerequisites hold (module docs): `Err(why)` if not.
/// Checked once per process; the stale sweep runs with the check.
fn prerequisites() -> &'static Result<(), String> {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    CHECKED.get_or_init(|| {
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root (network namespaces and iptables need it)".into());
        }
        for tool in [["ip", "-V"], ["iptables", "--version"]] {
            run(&tool).map_err(|e| format!("`{}` is not usable: {e}", tool[0]))?;
        }
        sweep_stale();
        let probe = format!("{PREFIX}{}-probe", std::process::id());
        run(&["ip", "netns", "add", &probe])?;
        let rules = run(&["ip", "netns", "exec", &probe, "iptables", "-w", "-S"]);
        let _ = run(&["ip", "netns", "del", &probe]);
        rules
    })
}

/// Deletes the namespaces of this prefix whose process is gone, after
/// killing what still runs in them (module docs).
fn sweep_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "NAME" or "NAME (id: N)".
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Ok(pids) = Command::new("ip").args(["netns", "pids", name]).output() {
            for p in String::from_utf8_lossy(&pids.stdout).lines() {
                if let Ok(p) = p.trim().parse::<i32>() {
                    // SAFETY: kill(2); `p` runs in a namespace of a test
                    // process that no longer exists.
                    unsafe { libc::kill(p, libc::SIGKILL) };
                }
            }
        }
        let _ = run(&["ip", "netns", "del", name]);
        eprintln!("netns: swept the stale namespace {name}");
    }
}

/// The namespaces of one set, their links, and the rules cut into them
/// (module docs). The thread that created it is in its hub until dropped.
pub struct Net {
    hub: String,
    /// Member id → its namespace.
    members: BTreeMap<u64, String>,
    /// The creating thread's own namespace, to return to.
    home: Option<File>,
}

impl Net {
    /// Creates the namespaces of members `ids`, the bridge and the veths,
    /// and moves the calling thread into the hub. Panics if a step fails
    /// (the prerequisites held); what was made is deleted by `Drop`.
    fn create(ids: &[u64]) -> Net {
        static SETS: AtomicU64 = AtomicU64::new(0);
        let n = SETS.fetch_add(1, Ordering::AcqRel);
        let base = format!("{PREFIX}{}-{n}", std::process::id());
        let mut net = Net {
            hub: format!("{base}-hub"),
            members: BTreeMap::new(),
            home: None,
        };
        must(&["ip", "netns", "add", &net.hub]);
        let hub = net.hub.clone();
        must(&["ip", "-n", &hub, "link", "set", "lo", "up"]);
        must(&["ip", "-n", &hub, "link", "add", "br0", "type", "bridge"]);
        must(&[
            "ip",
            "-n",
            &hub,
            "addr",
            "add",
            &format!("{HUB_ADDR}/24"),
            "dev",
            "br0",
        ]);
        must(&["ip", "-n", &hub, "link", "set", "br0", "up"]);
        for &id in ids {
            let ns = format!("{base}-{id}");
            must(&["ip", "netns", "add", &ns]);
            net.members.insert(id, ns.clone());
            let port = format!("m{id}");
            must(&[
                "ip", "-n", &hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ]);
            must(&[
                "ip", "-n", &hub, "link", "set", &port, "master", "br0", "up",
            ]);
            must(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
            let addr = format!("{}/24", member_addr(id));
            must(&["ip", "-n", &ns, "addr", "add", &addr, "dev", "eth0"]);
            must(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
        }
        net.enter_hub();
        net
    }

    fn enter_hub(&mut self) {
        let home = File::open("/proc/thread-self/ns/net").expect("open this thread's namespace");
        let hub = File::open(format!("/run/netns/{}", self.hub)).expect("open the hub namespace");
        // SAFETY: setns(2) on a namespace file we hold open; it moves only
        // this thread.
        let r = unsafe { libc::setns(hub.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
        self.home = Some(home);
    }

    /// `ip netns exec NS` of member `id`: the command a member runs under.
    pub fn exec_prefix(&self, id: u64) -> Vec<String> {
        ["ip", "netns", "exec", &self.members[&id]]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// Appends `rule` to the INPUT chain of namespace `ns`.
    fn drop_in(&self, ns: &str, rule: &[&str]) {
        let mut args = vec!["ip", "netns", "exec", ns, "iptables", "-w", "-A", "INPUT"];
        args.extend_from_slice(rule);
        args.extend_from_slice(&["-j", "DROP"]);
        must(&args);
    }

    /// Drops every packet `from` sends to `to`, on arrival at `to`.
    pub fn drop_one_way(&self, from: u64, to: u64) {
        self.drop_in(&self.members[&to], &["-s", &member_addr(from)]);
    }

    /// Cuts member `id` from every other member, both ways; the hub (its
    /// clients) still reaches it.
    pub fn isolate(&self, id: u64) {
        for &peer in self.members.keys().filter(|&&p| p != id) {
            self.drop_one_way(id, peer);
            self.drop_one_way(peer, id);
        }
    }

    /// Cuts member `id` from the other members and from its clients.
    pub fn isolate_completely(&self, id: u64) {
        self.drop_in(&self.members[&id], &["-i", "eth0"]);
        let from = member_addr(id);
        for ns in self
            .members
            .iter()
            .filter(|(&p, _)| p != id)
            .map(|(_, ns)| ns)
        {
            self.drop_in(ns, &["-s", &from]);
        }
        self.drop_in(&self.hub, &["-s", &from]);
    }

    /// Removes every rule: each namespace's INPUT chain flushed.
    pub fn heal_all(&self) {
        for ns in self.members.values().chain([&self.hub]) {
            must(&["ip", "netns", "exec", ns, "iptables", "-w", "-F", "INPUT"]);
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            // SAFETY: setns(2) back to the namespace this thread came from.
            unsafe { libc::setns(home.as_raw_fd(), libc::CLONE_NEWNET) };
        }
        for ns in self.members.values().chain([&self.hub]) {
            if let Err(e) = run(&["ip", "netns", "del", ns]) {
                eprintln!("netns: {e}");
            }
        }
    }
}

/// One member: its process and the times it ended by itself.
struct Slot {
    member: ReplicaMember,
    exits: u64,
}

/// Three members in namespaces of their own (module docs), each group in
/// files of its own (`--small-group-bytes-max 0`) to compare them after
/// a clean stop. Field order is drop order: the members are killed
/// before their namespaces are deleted, and those before the directory.
pub struct NetnsSet {
    slots: BTreeMap<u64, Slot>,
    pub net: Net,
    _root: tempfile::TempDir,
}

impl NetnsSet {
    /// Starts the set, or returns `None` after printing why the test
    /// skips (module docs).
    pub fn start(test: &str) -> Option<NetnsSet> {
        if let Err(why) = prerequisites() {
            // Straight to the file descriptor: the harness captures only
            // what the print macros write.
            let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {why}");
            return None;
        }
        // Built before the thread moves to the hub.
        tidemark_bin();
        let root = tempfile::tempdir().expect("temp dir");
        let net = Net::create(&IDS);
        let mut slots = BTreeMap::new();
        for &id in &IDS {
            let dir = root.path().join(format!("n{id}"));
            let me = member_addr(id);
            let mut args: Vec<String> = vec![
                "serve".into(),
                "--data".into(),
                dir.to_string_lossy().into_owned(),
                "--listen".into(),
                format!("{me}:{CLIENT_PORT}"),
                "--small-group-bytes-max".into(),
                "0".into(),
                "--cluster-node-id".into(),
                id.to_string(),
                "--cluster-listen".into(),
                format!("{me}:{CLUSTER_PORT}"),
            ];
            for &p in IDS.iter().filter(|&&p| p != id) {
                let peer = member_addr(p);
                args.push("--cluster-peer".into());
                args.push(format!("{p}={peer}:{CLUSTER_PORT},{peer}:{CLIENT_PORT}"));
            }
            let log = root.path().join(format!("n{id}.log"));
            let member = ReplicaMember::start_under(net.exec_prefix(id), id, dir, log, args);
            slots.insert(id, Slot { member, exits: 0 });
        }
        Some(NetnsSet {
            slots,
            net,
            _root: root,
        })
    }

    fn member(&mut self, id: u64) -> &mut ReplicaMember {
        &mut self.slots.get_mut(&id).expect("a member").member
    }
}

impl SetUnderFaults for NetnsSet {
    fn addr(&self, id: u64) -> String {
        format!("{}:{CLIENT_PORT}", member_addr(id))
    }

    fn dir(&self, id: u64) -> &Path {
        &self.slots[&id].member.dir
    }

    fn kill(&mut self, id: u64) {
        self.member(id).kill();
    }

    fn restart(&mut self, id: u64) {
        let m = self.member(id);
        m.kill();
        m.spawn();
    }

    fn pause(&self, id: u64) {
        self.slots[&id].member.signal(libc::SIGSTOP);
    }

    fn resume(&self, id: u64) {
        self.slots[&id].member.signal(libc::SIGCONT);
    }

    fn isolate(&self, id: u64) {
        self.net.isolate(id);
    }

    fn cut_one_way(&self, from: u64, to: u64) {
        self.net.drop_one_way(from, to);
    }

    fn heal_all(&self) {
        self.net.heal_all();
    }

    fn supervise(&mut self) -> Vec<u64> {
        let mut restarted = Vec::new();
        for (&id, slot) in &mut self.slots {
            if let Some(status) = slot.member.ended() {
                let log = slot.member.log_text();
                let tail: Vec<&str> = log.lines().rev().take(8).collect();
                eprintln!(
                    "netns: node {id} ended by itself ({status}); its log ends:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
                slot.exits += 1;
                slot.member.spawn();
                restarted.push(id);
            }
        }
        restarted
    }

    fn exits(&self) -> Vec<u64> {
        self.slots.values().map(|s| s.exits).collect()
    }

    fn terminate_all(&mut self) {
        for slot in self.slots.values_mut() {
            // A stopped process does not handle SIGTERM.
            slot.member.signal(libc::SIGCONT);
            slot.member.terminate();
        }
    }

    fn start_all(&mut self) {
        for slot in self.slots.values_mut() {
            slot.member.spawn();
        }
    }
}
