//! The command line of `tidemark bench`: which workloads, against which
//! node, at which scale. Sizes default to IM-bench v1 (design brief
//! section 5); every one can be scaled down.

use std::path::PathBuf;

use super::plan::SEED_DEFAULT;

/// A workload of IM-bench v1, or the mixed gateway workload.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Appends: random groups, pipelined sends.
    W1,
    /// Fan-out pull: one group, every member pulls its backlog in pages.
    W2,
    /// ACK storm: single ACKs moving random members' cursors.
    W3,
    /// Unread counts of every group of random users.
    W4,
    /// Zipf group sizes, online members pushed, offline members syncing.
    Mixed,
    /// Population: many groups of an IM node's size mix, Zipf sends, clean
    /// and crash restarts; disk, memory and restart figures (needs --spawn).
    Population,
    /// Receipts: the W3 ACK storm in one large group without, then with,
    /// receipt subscribers (SUBSCRIBE_RECEIPTS): what a receipt costs.
    Receipts,
    /// Joins: memberships loaded with pipelined JOINs (`-c 1`: what one
    /// connection's pipelined JOINs cost in commit rounds).
    Joins,
    /// Creation: many groups created over the wire, then their members
    /// joined; groups/s and joins/s with the commit rounds behind them.
    Create,
    /// W1, W2, W3, W4 and mixed (not population, receipts, joins or create).
    All,
}

impl Workload {
    /// Whether `--ops` sets how many operations it measures (W3's and
    /// receipts' ACKs, W4's queries); the others measure messages
    /// (`--messages`) or a population.
    pub fn takes_ops(self) -> bool {
        matches!(
            self,
            Workload::W3 | Workload::W4 | Workload::Receipts | Workload::Joins
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Workload::W1 => "w1",
            Workload::W2 => "w2",
            Workload::W3 => "w3",
            Workload::W4 => "w4",
            Workload::Mixed => "mixed",
            Workload::Population => "population",
            Workload::Receipts => "receipts",
            Workload::Joins => "joins",
            Workload::Create => "create",
            Workload::All => "all",
        }
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// Workloads, comma-separated: w1, w2, w3, w4, mixed, population, receipts,
    /// joins, create, all (all = w1..w4 and mixed).
    #[arg(
        long,
        short = 'w',
        value_enum,
        value_delimiter = ',',
        default_value = "w1,w2,w3,w4"
    )]
    pub workload: Vec<Workload>,
    /// Address of a running node (not used with --spawn).
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub addr: String,
    /// Start a node per workload on a fresh temporary directory, stop it after.
    #[arg(long)]
    pub spawn: bool,
    /// The tidemark binary --spawn starts (default: this executable).
    #[arg(long)]
    pub node_bin: Option<PathBuf>,
    /// fsync policy of a spawned node: always, interval:MS, never.
    #[arg(long, default_value = "always")]
    pub fsync: String,
    /// Directory in which spawned nodes get their data directories
    /// (default: the system's temporary directory). `--data-dir` is a
    /// deprecated spelling, still accepted.
    #[arg(long = "data", alias = "data-dir", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Keep a spawned node's data directory after the run (its path is
    /// printed on stderr), to inspect it or time restarts of it.
    #[arg(long)]
    pub keep_data: bool,
    /// File with the token the node requires (trailing newline ignored).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Client connections (one thread each).
    #[arg(long, short = 'c', default_value_t = 16)]
    pub connections: usize,
    /// Requests in flight per connection.
    #[arg(long, default_value_t = 16)]
    pub in_flight: usize,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 200)]
    pub size: usize,
    /// Groups (W1: 10,000; W4: 10,000; mixed: 100; population, create:
    /// 1,000,000; joins: 1,000).
    #[arg(long)]
    pub groups: Option<u64>,
    /// Members (W2: 2,000; W3: 100,000), users (W4, mixed: 100,000;
    /// population: as many as groups, at least 1,000); create: members
    /// joined to each group (2; 0: creation only).
    #[arg(long)]
    pub members: Option<u64>,
    /// Messages sent (W1, population: 1,000,000; mixed: 20,000) or stored before the
    /// measured phase (W2: 100,000; W3: 1,000; W4: 1,000,000).
    #[arg(long)]
    pub messages: Option<u64>,
    /// Measured operations: W3 ACKs (1,000,000), W4 queries (100,000),
    /// receipts ACKs (200,000), joins JOINs (200,000). Refused unless one of
    /// those runs: W1 and mixed are sized by --messages.
    #[arg(long)]
    pub ops: Option<u64>,
    /// W4: groups per user.
    #[arg(long, default_value_t = 50)]
    pub groups_per_user: u64,
    /// W2 and mixed: records per pulled page; population: per HISTORY page
    /// of the validation.
    #[arg(long, default_value_t = 200)]
    pub page: u32,
    /// Stop the measured phase after this many seconds (the figures cover
    /// what was done; verification checks that part).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Seed of payloads, groups, cursors and queries.
    #[arg(long, default_value_t = SEED_DEFAULT)]
    pub seed: u64,
    /// Print one JSON object per workload (and no human summary).
    #[arg(long)]
    pub json: bool,
    /// No progress line.
    #[arg(long)]
    pub quiet: bool,
    /// Offset of every group and user id (default: 0 with --spawn, else
    /// derived from the clock so that runs against one node do not collide).
    #[arg(long)]
    pub id_base: Option<u64>,
    /// mixed: fraction of users online (subscribed through a gateway).
    #[arg(long, default_value_t = 0.1)]
    pub online: f64,
    /// mixed: gateway connections carrying the subscriptions.
    #[arg(long, default_value_t = 2)]
    pub gateways: usize,
    /// mixed: largest group (Zipf, exponent 1, from 2 members); population:
    /// largest big group (its band is 1,000 up to this).
    #[arg(long, default_value_t = 100_000)]
    pub group_size_max: u64,
    /// mixed: offline users that catch up with SYNC and BATCH_ACK.
    #[arg(long, default_value_t = 1_000)]
    pub catchup_users: u64,
    /// population: the spawned node's `serve --idle-evict-ms`, so that the
    /// memory figures are those of idle groups (read once the groups went
    /// idle); not passed to a binary whose `serve` lacks the flag (0.1,
    /// whose groups never give their memory back). 0: not passed either
    /// (the node's default, 10 minutes) and memory read at once.
    #[arg(long, default_value_t = 5_000)]
    pub node_idle_evict_ms: u64,
    /// population: the spawned node's `serve --checkpoint-interval-ms`
    /// (default: the node's own); new groups give their memory back only
    /// after a checkpoint, so a short one shortens the wait for idle
    /// groups in small runs.
    #[arg(long)]
    pub node_checkpoint_interval_ms: Option<u64>,
    /// population: the spawned node's `serve --small-group-bytes-max`
    /// (default: the node's own): groups whose records stay within it keep
    /// them in the shared journal, with no file of their own.
    #[arg(long)]
    pub node_small_group_bytes_max: Option<u64>,
    /// receipts: connections subscribed to the group's receipts in the
    /// second run.
    #[arg(long, default_value_t = 4)]
    pub receipt_subscribers: usize,
    /// receipts: the spawned node's `serve --receipt-members-max` (default:
    /// the node's own, 1,000, so a 100,000-member group gets counts-only
    /// receipts); above the group's size it measures list receipts.
    #[arg(long)]
    pub node_receipt_members_max: Option<u64>,
}

impl BenchArgs {
    /// The workloads to run, `all` expanded, in order, without repeats.
    pub fn workloads(&self) -> Vec<Workload> {
        let mut out = Vec::new();
        for &w in &self.workload {
            let ws: &[Workload] = if w == Workload::All {
                &[
                    Workload::W1,
                    Workload::W2,
                    Workload::W3,
                    Workload::W4,
                    Workload::Mixed,
                ]
            } else {
                std::slice::from_ref(&w)
            };
            for &w in ws {
                if !out.contains(&w) {
                    out.push(w);
                }
            }
        }
        out
    }
}

/// A parser for `BenchArgs` alone (tests, and programs that embed the tool).
#[derive(clap::Parser)]
#[command(name = "tidemark bench", no_binary_name = true)]
struct Standalone {
    #[command(flatten)]
    args: BenchArgs,
}

impl BenchArgs {
    /// Parses flags as `tidemark bench` would (without the program name).
    pub fn parse_flags<I, T>(flags: I) -> Result<BenchArgs, String>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::Parser;
        Standalone::try_parse_from(flags)
            .map(|s| s.args)
            .map_err(|e| e.to_string())
    }
}
