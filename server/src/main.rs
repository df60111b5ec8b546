//! The `tidemark` binary: `tidemark serve` runs a node; the client
//! subcommands (`send`, `pull`, ..., `demo`) live in `tidemark_server::cli`,
//! the node in `tidemark_node`; `completions` and `man` print what a shell
//! and `man` take, made from these definitions.

use std::ffi::OsString;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use log::LevelFilter;
use tidemark_engine::FsyncPolicy;
use tidemark_node::{LiveLimits, NodeConfig};
use tidemark_server::cluster::Served;
use tidemark_server::logging::{LogFormat, LogLevel, LogSettings};
use tidemark_server::reload::{Plan, Settings};
use tidemark_server::signals::Signals;

/// mimalloc instead of glibc's malloc: a node holds millions of small,
/// long-lived objects (groups, member lists) made in bursts interleaved
/// with transient buffers (commit rounds, checkpoint deltas). mimalloc
/// keeps each size in pages of its own and gives freed pages back to the
/// kernel, where glibc's heaps keep the holes the transients leave between
/// the groups (BENCHMARKS.md, "Memory per idle group and per membership";
/// README, "Sizing").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's options as `mi_option_t` numbers of the vendored mimalloc 3
/// (`mimalloc.h`, `enum mi_option_e`; the sys crate's named constants are
/// mimalloc 2's and lack these two). Pinned with the crate by Cargo.lock.
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Gives freed pages back at once (`purge_delay` 0, mimalloc's default is
/// a second, and a purge waits for later allocations to notice it) and
/// commits arena memory only as it is used (`arena_eager_commit` 0, not
/// a whole reservation up front): resident memory then follows what the
/// node holds, which the sizing of `groups_max` counts on. An option set
/// in the environment (`MIMALLOC_PURGE_DELAY`, ...) is left as it is.
///
/// Run as a load-time constructor ([`TUNE_ALLOCATOR_AT_LOAD`]), before
/// the runtime's first allocation reserves mimalloc's first arena: set in
/// `main`, the options came too late for it (19 MB resident when empty
/// instead of 10, and 268 bytes per idle group instead of 239, at 200,000
/// groups).
extern "C" fn tune_allocator() {
    for (option, env) in [
        (MI_OPTION_PURGE_DELAY, "MIMALLOC_PURGE_DELAY"),
        (MI_OPTION_ARENA_EAGER_COMMIT, "MIMALLOC_ARENA_EAGER_COMMIT"),
    ] {
        if std::env::var_os(env).is_none() {
            // SAFETY: a setter of mimalloc's option table (one atomic
            // store), called before any thread of ours starts.
            unsafe { libmimalloc_sys::mi_option_set(option, 0) };
        }
    }
}

/// mimalloc's `purge_delay` while the saved state loads in the
/// background: a second (mimalloc's default) instead of 0. The loader
/// frees and takes pages again at a high rate (its batches, users' lists
/// growing a membership at a time); giving each back to the kernel at
/// once and faulting it in again cost about a fifth of the load
/// (BENCHMARKS.md, "Restart: the background load ..."). Back to 0 when
/// the load ends, with a collection that gives back what the delay kept.
const LOADING_PURGE_DELAY_MS: std::os::raw::c_long = 1_000;

/// The engine's loading hook ([`tidemark_engine::set_loading_hook`]):
/// [`LOADING_PURGE_DELAY_MS`] from the first load's start to the last
/// one's end. A delay set in the environment is left as it is.
fn purge_later_while_loading(loading: bool) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static LOADS: AtomicUsize = AtomicUsize::new(0);
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    if loading {
        if LOADS.fetch_add(1, Ordering::AcqRel) == 0 {
            // SAFETY: a setter of mimalloc's option table (one atomic store).
            unsafe {
                libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, LOADING_PURGE_DELAY_MS)
            };
        }
    } else if LOADS.fetch_sub(1, Ordering::AcqRel) == 1 {
        // SAFETY: the setter as above; a collection of this thread's heap,
        // which purges the pages whose purge the delay put off.
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
            libmimalloc_sys::mi_collect(true);
        }
    }
}

/// [`tune_allocator`] in the ELF constructor list, which the loader runs
/// before the Rust runtime starts (and allocates).
#[used]
#[link_section = ".init_array"]
static TUNE_ALLOCATOR_AT_LOAD: extern "C" fn() = tune_allocator;

#[derive(Parser)]
#[command(
    name = "tidemark",
    version = tidemark_server::VERSION,
    about = "Storage node for group-chat messages"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node.
    Serve(ServeArgs),
    #[command(flatten)]
    Client(tidemark_server::cli::ClientCommand),
    /// Load tool: drive a node (or `--spawn` one) with IM-bench workloads.
    Bench(tidemark_server::bench::BenchArgs),
    /// Offline tool for a stopped node's data directory: inspect, dump,
    /// verify, repair. Exit status 0: done / clean; 1: damage found or
    /// repair not done; 2: could not run.
    Ctl(tidemark_server::cli::ctl::CtlArgs),
    /// Print the shell completion script of `tidemark` for SHELL on
    /// standard output (e.g. `tidemark completions bash >
    /// /usr/share/bash-completion/completions/tidemark`).
    Completions(CompletionsArgs),
    /// Print the manual page (roff) of `tidemark`, or of one of its
    /// commands, on standard output (`tidemark man | man -l -`).
    Man(ManArgs),
}

#[derive(Args)]
struct CompletionsArgs {
    /// The shell the script is for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(Args)]
struct ManArgs {
    /// The command whose page to print (`serve`, `send`, ...); without
    /// it, the page of `tidemark`, which lists every command.
    command: Option<String>,
}

#[derive(Args)]
struct ServeArgs {
    /// TOML file of these settings: each flag below is a key, with `_` for
    /// `-` (`frame_bytes_max = 16777216`); a flag given here overrides the
    /// file's key. server/tidemark.example.toml lists every key with its
    /// default.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Data directory (created if missing).
    #[arg(long, default_value = tidemark_node::defaults::DATA_DIR)]
    data: PathBuf,
    /// Address to listen on, HOST:PORT (a name such as localhost is
    /// resolved at start); port 0 picks a free port (printed at start).
    #[arg(long, value_parser = tidemark_server::units::parse_listen, default_value = tidemark_node::defaults::LISTEN)]
    listen: SocketAddr,
    /// When a send is acknowledged: always (after fsync), interval:MS, never.
    #[arg(long, default_value = "always", value_parser = parse_fsync)]
    fsync: FsyncPolicy,
    /// File holding the token clients must AUTH with (trailing newline ignored).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Largest frame (bytes after the length prefix).
    #[arg(long, value_parser = tidemark_server::units::parse_bytes_u32, default_value_t = tidemark_node::defaults::FRAME_BYTES_MAX)]
    frame_bytes_max: u32,
    /// Largest message payload.
    #[arg(long, value_parser = tidemark_server::units::parse_bytes_usize, default_value_t = tidemark_engine::defaults::PAYLOAD_BYTES_MAX)]
    payload_bytes_max: usize,
    /// Connections at once.
    #[arg(long, default_value_t = tidemark_node::defaults::CONNECTIONS_MAX)]
    connections_max: usize,
    /// Output buffered per connection before reads stop and pushes are dropped.
    #[arg(long, value_parser = tidemark_server::units::parse_bytes_usize, default_value_t = tidemark_node::defaults::OUTPUT_BYTES_MAX)]
    output_bytes_max: usize,
    /// Requests answered later (sends, joins, long polls) per connection.
    #[arg(long, default_value_t = tidemark_node::defaults::REQUESTS_IN_FLIGHT_MAX)]
    requests_in_flight_max: u32,
    /// Longest PULL wait honoured, in milliseconds.
    #[arg(long, value_parser = tidemark_server::units::parse_ms_u32, default_value_t = tidemark_node::defaults::LONG_POLL_MS_MAX)]
    long_poll_ms_max: u32,
    /// Subscriptions (users + groups) per connection.
    #[arg(long, default_value_t = tidemark_node::defaults::SUBSCRIPTIONS_MAX)]
    subscriptions_max: usize,
    /// A frame must arrive whole within this many milliseconds of its first
    /// byte, or the connection is closed (BAD_FRAME).
    #[arg(long, value_parser = tidemark_server::units::parse_ms, default_value_t = tidemark_node::defaults::FRAME_TIMEOUT_MS)]
    frame_timeout_ms: u64,
    /// Groups with more members than this get counts-only receipts
    /// (RECEIPT_COUNTS of each subscribed sender's recent messages) instead
    /// of a RECEIPT listing every member whose cursor moved.
    #[arg(long, default_value_t = tidemark_node::defaults::RECEIPT_MEMBERS_MAX)]
    receipt_members_max: usize,
    /// Receipts are coalesced over this many milliseconds: at most one per
    /// member (or per subscribed sender) per interval, latest cursor wins;
    /// 0 sends them at the end of every pass of the event loop.
    #[arg(long, value_parser = tidemark_server::units::parse_ms, default_value_t = tidemark_node::defaults::RECEIPT_INTERVAL_MS)]
    receipt_interval_ms: u64,
    /// Output queued by all connections together; above it the connections
    /// with the most output queued are closed.
    #[arg(long, value_parser = tidemark_server::units::parse_bytes_usize, default_value_t = tidemark_node::defaults::OUTPUT_BYTES_TOTAL_MAX)]
    output_bytes_total_max: usize,
    /// Input buffered by all connections together; a frame that would pass
    /// it gets OVERLOADED and a close.
    #[arg(long, value_parser = tidemark_server::units::parse_bytes_usize, default_value_t = tidemark_node::defaults::INPUT_BYTES_TOTAL_MAX)]
    input_bytes_total_max: usize,
    /// Dedup entries remembered by all groups together (see the spec's
    /// dedup window): past it, idle groups' windows leave memory.
    #[arg(long, default_value_t = tidemark_engine::defaults::DEDUP_ENTRIES_TOTAL_MAX)]
    dedup_entries_total_max: usize,
    /// A group unused this long (ms) gives back its send state and dedup
    /// window (rebuilt from its log on its next SEND) and its small log.
    #[arg(long, value_parser = tidemark_server::units::parse_ms, default_value_t = tidemark_engine::defaults::IDLE_EVICT_MS)]
    idle_evict_ms: u64,
    /// Register every saved group and membership before listening. By
    /// default the node listens once the journal tail is replayed and the
    /// saved state's checksums are checked, takes a group from the saved
    /// state at its first request, and loads the rest in the background.
    #[arg(long)]
    load_before_listening: bool,
    /// Test knob: the background load waits this long (ms) before each
    /// batch, so tests can act while it is pending.
    #[arg(long, default_value_t = 0, hide = true)]
    load_batch_pause_ms: u64,
    /// Members per group.
    #[arg(long, default_value_t = tidemark_engine::defaults::MEMBERS_PER_GROUP_MAX)]
    members_per_group_max: usize,
    /// Groups per user.
    #[arg(long, default_value_t = tidemark_engine::defaults::GROUPS_PER_USER_MAX)]
    groups_per_user_max: usize,
    /// Segment files kept open.
    #[arg(long, default_value_t = tidemark_engine::defaults::OPEN_SEGMENTS_MAX)]
    open_segments_max: usize,
    /// Segment size before a new segment starts.
    #[arg(long, value_parser = tidemark_server::units::parse_bytes, default_value_t = tidemark_engine::defaults::SEGMENT_BYTES_MAX)]
    segment_bytes_max: u64,
    /// A group whose records take at most this many bytes keeps them in the
    /// shared journal, without files of its own; past it the group gets
    /// its own segment files (0: every group with a record has them).
    /// Journal files stay while small groups' records are in them.
    #[arg(long, value_parser = tidemark_server::units::parse_bytes, default_value_t = tidemark_engine::defaults::SMALL_GROUP_BYTES_MAX)]
    small_group_bytes_max: u64,
    /// Below this much free space in the data directory's file system, sends
    /// are refused (OVERLOADED, detail = free bytes) until space returns.
    /// 0 turns the reserve off (a write that finds the disk full is then
    /// held until space returns, and sends are refused meanwhile).
    #[arg(long, value_parser = tidemark_server::units::parse_bytes, default_value_t = tidemark_engine::defaults::DISK_FREE_MIN_BYTES)]
    disk_free_min_bytes: u64,
    /// Moved cursors (ACKs) are persisted at least this often, in
    /// milliseconds; a crash forgets at most the ACKs of the last interval.
    #[arg(long, value_parser = tidemark_server::units::parse_ms, default_value_t = tidemark_engine::defaults::CURSOR_FLUSH_MS)]
    cursor_flush_ms: u64,
    /// A checkpoint is taken once this many journal bytes were written
    /// since the last one (checkpoints write what changed, beside the
    /// commit rounds).
    #[arg(long, value_parser = tidemark_server::units::parse_bytes, default_value_t = tidemark_engine::defaults::CHECKPOINT_JOURNAL_BYTES)]
    checkpoint_journal_bytes: u64,
    /// ...and at least this often, in milliseconds, when anything changed.
    #[arg(long, value_parser = tidemark_server::units::parse_ms, default_value_t = tidemark_engine::defaults::CHECKPOINT_INTERVAL_MS)]
    checkpoint_interval_ms: u64,
    /// Retention policy of every group created from now on (stored with
    /// the group at its creation: changing it later changes no existing
    /// group; SET_RETENTION changes one): drop messages every member
    /// acknowledged.
    #[arg(long)]
    retention_by_cursor: bool,
    /// ...and messages older than this many milliseconds (0: no age limit).
    #[arg(long, value_parser = tidemark_server::units::parse_ms, default_value_t = 0)]
    retention_max_age_ms: u64,
    /// ...and the oldest messages while a group's stored messages take more
    /// than this many bytes (0: no size limit).
    #[arg(long, value_parser = tidemark_server::units::parse_bytes, default_value_t = 0)]
    retention_max_bytes: u64,
    /// Retention policies are applied at least this often, in milliseconds
    /// (the files of dropped messages go with the second checkpoint after).
    #[arg(long, value_parser = tidemark_server::units::parse_ms, default_value_t = tidemark_engine::defaults::RETENTION_CHECK_MS)]
    retention_check_ms: u64,
    /// Refuse SENDs whose sender is not a member of the group (NOT_MEMBER),
    /// except from system senders. Off by default: protocol version 1
    /// lets the gateway authorise senders, and the node stores any sender.
    #[arg(long)]
    send_requires_membership: bool,
    /// A user id that may send to any group under
    /// --send-requires-membership (a bot, the application's notices);
    /// repeat the flag for more.
    #[arg(
        long = "system-sender",
        value_name = "USER_ID",
        requires = "send_requires_membership"
    )]
    system_senders: Vec<u64>,
    /// A user id that may EDIT and RECALL any member's message (a
    /// moderator, the application's own service), within the change
    /// window; repeat the flag for more. No default: none.
    #[arg(long = "admin-sender", value_name = "USER_ID")]
    admin_senders: Vec<u64>,
    /// How long after a message was accepted its sender (or an admin
    /// sender) may still edit or recall it, in milliseconds.
    #[arg(long, value_parser = tidemark_server::units::parse_ms, default_value_t = tidemark_engine::defaults::CHANGE_WINDOW_MS)]
    change_window_ms: u64,
    /// Serve the STATS figures in the Prometheus text format at
    /// http://ADDR/metrics (port 0 picks a free port; INFO names it). A
    /// port alone (`9070` or `:9070`) binds loopback, 127.0.0.1: the
    /// endpoint has no authentication, so keep it on loopback or behind a
    /// proxy that has. No default: no endpoint.
    #[arg(long, value_name = "ADDR", value_parser = parse_metrics_listen)]
    metrics_listen: Option<SocketAddr>,
    /// Requests that take at least this many microseconds (from handling
    /// to queueing the response) go to the slow log; 0: every request.
    #[arg(long, default_value_t = tidemark_node::defaults::SLOWLOG_THRESHOLD_US)]
    slowlog_threshold_us: u64,
    /// Slow requests kept, the newest (`tidemark slowlog` lists them); 0
    /// keeps none.
    #[arg(long, default_value_t = tidemark_node::defaults::SLOWLOG_ENTRIES_MAX)]
    slowlog_entries_max: usize,
    /// Log level of every module: off, error, warn, info, debug, trace.
    /// Given here or as `log_level` in the config file it wins over the
    /// RUST_LOG environment variable (env_logger's directives, per module
    /// if wanted: `warn,tidemark_node=debug`), which applies only when
    /// neither gives it. SIGHUP applies a change made in the config file.
    #[arg(long, value_enum, default_value_t = LogLevel::Info)]
    log_level: LogLevel,
    /// Format of the log on standard error: text, or json (one object per
    /// line with the members ts, level, target and message, for log
    /// shippers).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// This node's id in its replica set (non-zero). With --cluster-listen
    /// and --cluster-peer the node is a replica set member: only the leader
    /// serves requests, the others answer NOT_LEADER (format-spec/cluster.md).
    /// No default: a single node.
    #[arg(long, value_name = "ID")]
    cluster_node_id: Option<u64>,
    /// Address this member listens on for the other members' Raft messages.
    /// No default.
    #[arg(long, value_name = "ADDR", value_parser = tidemark_server::units::parse_listen)]
    cluster_listen: Option<SocketAddr>,
    /// Another member of the replica set: its id, the address of its
    /// --cluster-listen and its client address (--listen), as
    /// ID=PEER_HOST:PORT,CLIENT_HOST:PORT; once per other member, the same
    /// set on every member. No default.
    #[arg(long = "cluster-peer", value_name = "PEER", value_parser = tidemark_server::cluster::parse_peer)]
    cluster_peers: Vec<tidemark_server::cluster::Peer>,
    /// A replica set member's Raft log bound in bytes: past it the log drops
    /// what the engine holds durably, keeping at most half of it for a
    /// lagging follower, which beyond that is sent a snapshot
    /// (format-spec/cluster.md sections 3.5 and 8).
    #[arg(long, value_parser = tidemark_server::units::parse_bytes, value_name = "BYTES", default_value_t = tidemark_cluster::RAFT_LOG_MAX_BYTES_DEFAULT)]
    raft_log_max_bytes: u64,
    /// The cluster map file (format-spec/cluster.md section 9.1,
    /// server/cluster-map.example.toml): the replica sets, their members'
    /// addresses and which set owns each of the 1024 shards. With
    /// --cluster-node-id the node finds its set and peers there (no
    /// --cluster-peer; --cluster-listen defaults to its map address) and
    /// answers WRONG_SET to requests for other sets' groups. No default.
    #[arg(long, value_name = "FILE")]
    cluster_map: Option<PathBuf>,
    /// With --cluster-node-id, --cluster-listen and --cluster-peer (the
    /// set's members): an empty data directory waits to be added to that
    /// set (`tidemark cluster add`) instead of starting one; it catches up
    /// by a snapshot (format-spec/cluster.md section 11.2). Ignored once
    /// the directory holds a membership.
    #[arg(long)]
    cluster_join: bool,
    /// File holding the replica set's shared secret (at least 16 bytes; a
    /// trailing newline is ignored), the same file on every member: each
    /// connection between members proves it before any Raft message is
    /// read (format-spec/cluster.md section 7.1). A member refuses to
    /// start without it unless --cluster-insecure is given. No default.
    #[arg(long, value_name = "FILE")]
    cluster_token_file: Option<PathBuf>,
    /// Run a replica set member without --cluster-token-file: anyone who
    /// reaches --cluster-listen can then change the set (elect a leader,
    /// replace its data). For tests on a closed machine only; the node
    /// says so in its log at start.
    #[arg(long)]
    cluster_insecure: bool,
}

/// Why the command line was refused.
enum ParseError {
    Usage(clap::Error),
    Config(tidemark_server::config_file::ConfigFileError),
}

/// A `serve --config` file that was applied: its path and what it set.
type LoadedFile = (PathBuf, tidemark_server::config_file::FileArgs);

/// A command line as parsed.
struct Parsed {
    cli: Cli,
    /// The config file of `serve --config`.
    file: Option<LoadedFile>,
    /// What clap made of it (with the file's keys as flags): where each
    /// value came from, and its text.
    matches: ArgMatches,
}

/// Parses the command line. For `serve --config FILE`, the file's keys
/// become flags placed before the command line's own serve arguments, and
/// keys whose flag is on the command line are left out: flags override
/// the file, and both go through the same parsers.
fn parse_cli(argv: Vec<OsString>) -> Result<Parsed, ParseError> {
    let command = Cli::command();
    // A first look for `--config` and the flags given, without judging how
    // they fit together: what a flag requires may be in the file.
    let matches = command
        .clone()
        .ignore_errors(true)
        .try_get_matches_from(&argv)
        .ok();
    let config = matches.as_ref().and_then(|m| {
        let serve = m.subcommand_matches("serve")?;
        Some((serve, serve.get_one::<PathBuf>("config")?.clone()))
    });
    let Some((serve, path)) = config else {
        return parsed(command, argv, None);
    };
    let serve_command = command
        .find_subcommand("serve")
        .expect("Cli has a serve subcommand, which just matched");
    let file = tidemark_server::config_file::load(&path, serve_command, |id| {
        serve.value_source(id) == Some(ValueSource::CommandLine)
    })
    .map_err(ParseError::Config)?;
    // `Cli` has no options of its own: the subcommand is the first
    // argument, and serve's arguments are all after it.
    let split = argv.len().min(2);
    let mut with_file = argv[..split].to_vec();
    with_file.extend(file.args.iter().cloned());
    with_file.extend(argv[split..].iter().cloned());
    parsed(command, with_file, Some((path, file)))
}

/// `argv` parsed by `command` (the [`Cli`]'s), as `Cli::try_parse_from`
/// does, keeping the matches.
fn parsed(
    command: clap::Command,
    argv: Vec<OsString>,
    file: Option<LoadedFile>,
) -> Result<Parsed, ParseError> {
    let matches = command
        .try_get_matches_from(argv)
        .map_err(ParseError::Usage)?;
    let cli = Cli::from_arg_matches(&matches).map_err(ParseError::Usage)?;
    Ok(Parsed { cli, file, matches })
}

/// `tidemark serve`'s log settings (logging.rs: which level wins); `serve`
/// are the matches `a` came from.
fn serve_log(a: &ServeArgs, serve: &ArgMatches) -> LogSettings {
    let given = serve.value_source("log_level") != Some(ValueSource::DefaultValue);
    LogSettings {
        level: given.then_some(a.log_level),
        fallback: LevelFilter::Info,
        format: a.log_format,
    }
}

/// `--metrics-listen`: `HOST:PORT`, or a port alone (`PORT`, `:PORT`) on
/// loopback.
fn parse_metrics_listen(s: &str) -> Result<SocketAddr, String> {
    let port = s.strip_prefix(':').unwrap_or(s);
    if let Ok(port) = port.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    tidemark_server::units::parse_listen(s)
        .map_err(|e| format!("{e} (or a port alone for 127.0.0.1)"))
}

fn parse_fsync(s: &str) -> Result<FsyncPolicy, String> {
    s.parse().map_err(|e: tidemark_engine::Error| e.to_string())
}

/// The replica set flags of `tidemark serve`, unchecked.
fn cluster_args(a: &ServeArgs) -> tidemark_server::cluster::ClusterArgs {
    tidemark_server::cluster::ClusterArgs {
        node_id: a.cluster_node_id,
        listen: a.cluster_listen,
        peers: a.cluster_peers.clone(),
        raft_log_max_bytes: a.raft_log_max_bytes,
        map: a.cluster_map.clone(),
        join: a.cluster_join,
        token_file: a.cluster_token_file.clone(),
        insecure: a.cluster_insecure,
    }
}

/// The node's configuration from `tidemark serve`'s flags.
fn node_config(a: ServeArgs) -> Result<NodeConfig, String> {
    // Applied before: its keys are among the flags below.
    let _ = a.config;
    // The logger's, set up in `main` and by a reload.
    let _ = (a.log_level, a.log_format);
    let mut c = NodeConfig::new(a.data);
    c.listen = a.listen;
    c.engine.fsync = a.fsync;
    c.engine.payload_bytes_max = a.payload_bytes_max;
    c.engine.members_per_group_max = a.members_per_group_max;
    c.engine.groups_per_user_max = a.groups_per_user_max;
    c.engine.open_segments_max = a.open_segments_max;
    c.engine.segment_bytes_max = a.segment_bytes_max;
    c.engine.small_group_bytes_max = a.small_group_bytes_max;
    c.engine.disk_free_min_bytes = a.disk_free_min_bytes;
    c.engine.cursor_flush_ms = a.cursor_flush_ms;
    c.engine.checkpoint_journal_bytes = a.checkpoint_journal_bytes;
    c.engine.checkpoint_interval_ms = a.checkpoint_interval_ms;
    c.engine.retention_check_ms = a.retention_check_ms;
    c.engine.retention_default = tidemark_engine::Retention {
        by_cursor: a.retention_by_cursor,
        max_age_ms: a.retention_max_age_ms,
        max_bytes: a.retention_max_bytes,
    };
    c.limits.frame_bytes_max = a.frame_bytes_max;
    c.limits.connections_max = a.connections_max;
    c.limits.output_bytes_max = a.output_bytes_max;
    c.limits.requests_in_flight_max = a.requests_in_flight_max;
    c.limits.long_poll_ms_max = a.long_poll_ms_max;
    c.limits.subscriptions_max = a.subscriptions_max;
    c.limits.frame_timeout_ms = a.frame_timeout_ms;
    c.limits.receipt_members_max = a.receipt_members_max;
    c.limits.receipt_interval_ms = a.receipt_interval_ms;
    c.limits.output_bytes_total_max = a.output_bytes_total_max;
    c.limits.input_bytes_total_max = a.input_bytes_total_max;
    c.engine.dedup_entries_total_max = a.dedup_entries_total_max;
    c.engine.idle_evict_ms = a.idle_evict_ms;
    c.engine.load_in_background = !a.load_before_listening;
    c.engine.load_batch_pause_ms = a.load_batch_pause_ms;
    c.metrics_listen = a.metrics_listen;
    c.limits.slowlog_threshold_us = a.slowlog_threshold_us;
    c.limits.slowlog_entries_max = a.slowlog_entries_max;
    c.build = tidemark_node::Build {
        version: env!("CARGO_PKG_VERSION").to_string(),
        commit: tidemark_server::COMMIT.to_string(),
    };
    if a.send_requires_membership {
        c.sends = tidemark_node::SendPolicy::members_only(a.system_senders);
    }
    c.sends = c.sends.with_admins(a.admin_senders);
    c.engine.change_window_ms = a.change_window_ms;
    if let Some(path) = a.token_file {
        c.token = Some(tidemark_server::token_file::read_token_file(&path)?);
    }
    Ok(c)
}

/// `tidemark serve` with the arguments `a`, parsed from `argv` (the
/// settings `running`, with the config file `file`).
fn serve(
    a: ServeArgs,
    argv: Vec<OsString>,
    file: Option<PathBuf>,
    running: Settings,
) -> Result<(), String> {
    let abrupt = abrupt_exit_note(a.fsync);
    let cluster = cluster_args(&a).check()?;
    let c = node_config(a)?;
    let mut reloader = Reloader {
        argv,
        file,
        running,
        config: c.clone(),
    };
    // Before any thread starts (reading the settings above starts none):
    // every thread inherits the block of SIGINT, SIGTERM and SIGHUP, which
    // only the signal thread takes (signals.rs).
    let signals = Signals::start(
        abrupt,
        Box::new(move |hand_over| reloader.reload(hand_over)),
    )?;
    // The engine would fail on a file here with a bare "mkdir: File exists".
    let data = &c.engine.data_dir;
    if data.exists() && !data.is_dir() {
        return Err(format!(
            "data directory {} is not a directory",
            data.display()
        ));
    }
    log::info!(
        "starting tidemark {}: data {}, fsync {:?}",
        tidemark_server::VERSION,
        c.engine.data_dir.display(),
        c.engine.fsync
    );
    // Once per process: a restart in place (exec) starts a new one.
    tidemark_engine::set_loading_hook(purge_later_while_loading);
    let on_ready = |addr: SocketAddr, shutdown: tidemark_node::Shutdown| {
        // A signal that came while the node started shuts it down now.
        signals.serving(shutdown);
        // Scripts wait for this line: the node accepts connections now. A
        // closed standard output (`tidemark serve | true`, a log collector
        // that went away) must not stop a node that is serving: the line is
        // a convenience, the log on stderr says the same, so the node says
        // so there and goes on.
        let mut out = std::io::stdout().lock();
        if let Err(e) = writeln!(out, "tidemark listening on {addr}").and_then(|()| out.flush()) {
            log::warn!("listening on {addr} (standard output not writable: {e})");
        }
    };
    let why = match cluster {
        None => return tidemark_node::serve(c, on_ready),
        Some(cluster) => match tidemark_server::cluster::serve(c, cluster, on_ready)? {
            Served::Stopped => return Ok(()),
            Served::Restart(why) => why,
        },
    };
    // Everything the run held is closed. A signal taken since it started
    // asked the node to stop: it does (the next start finishes what the
    // restart was for); one that comes from now on stays pending across
    // the exec, and the new run shuts down at once (cluster.md 5.1).
    if let Some(sig) = signals.stop() {
        log::info!("not restarting ({why}): signal {sig} asked the node to stop");
        return Ok(());
    }
    log::warn!("restarting in place {why}");
    let e = tidemark_server::signals::exec_self();
    Err(format!("restart {why}: exec: {e}; start the node again"))
}

/// What a stop without the graceful shutdown leaves behind, per policy. A
/// process exit keeps everything the node wrote (the page cache survives
/// it); only what was never written is lost, and nothing of that was
/// answered.
fn abrupt_exit_note(fsync: FsyncPolicy) -> String {
    let answered = match fsync {
        FsyncPolicy::Always => "every answered send was fsynced before its answer and is kept",
        FsyncPolicy::Interval(_) | FsyncPolicy::Never => {
            "every answered send is in the journal and is kept (those not yet fsynced would not survive a power cut before the OS writes them)"
        }
    };
    format!(
        "stopping now, without a clean shutdown: {answered}; sends not yet answered (held by a full disk or still in flight) may or may not be stored, and their clients retransmit them with the same client_msg_id, which stores each once; cursor moves not yet flushed are lost (those messages are delivered again); the next start recovers from the journal"
    )
}

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let Parsed {
        cli,
        file: config_file,
        matches,
    } = match parse_cli(argv.clone()) {
        Ok(parsed) => parsed,
        Err(ParseError::Usage(e)) => return usage_error(e),
        Err(ParseError::Config(e)) => {
            eprintln!("tidemark: {e}");
            return ExitCode::FAILURE;
        }
    };
    let serve_matches = matches.subcommand_matches("serve");
    // A node logs its progress; a client command prints only its result
    // (RUST_LOG overrides that; `serve --log-level` overrides RUST_LOG).
    tidemark_server::logging::init(match (&cli.command, serve_matches) {
        (Command::Serve(a), Some(m)) => serve_log(a, m),
        _ => LogSettings {
            level: None,
            fallback: LevelFilter::Warn,
            format: LogFormat::Text,
        },
    });
    if let Some((path, file)) = &config_file {
        log::info!(
            "config file {}: {} key(s) applied [{}]; overridden by flags: [{}]",
            path.display(),
            file.applied.len(),
            file.applied.join(", "),
            file.overridden.join(", ")
        );
    }
    let result = match cli.command {
        Command::Serve(a) => {
            // Invariant: `serve` parsed, so it has matches.
            let running = serve_matches
                .map(|m| Settings::of(&serve_command(), m))
                .unwrap_or_default();
            serve(a, argv, config_file.map(|(path, _)| path), running)
        }
        Command::Client(c) => {
            let json = c.json();
            return match tidemark_server::cli::run(c) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tidemark_server::cli::report_error(&e, json);
                    ExitCode::FAILURE
                }
            };
        }
        Command::Bench(b) => tidemark_server::bench::run(b),
        Command::Ctl(c) => return tidemark_server::cli::ctl::run(c),
        Command::Completions(c) => completions(c.shell),
        Command::Man(m) => man(m.command.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tidemark: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What SIGHUP needs to read `serve`'s configuration again
/// (`tidemark_server::reload`: what is live and why).
struct Reloader {
    /// The command line, read again with the file as it is now.
    argv: Vec<OsString>,
    /// `--config`; without one there is nothing to reload.
    file: Option<PathBuf>,
    /// The settings the node runs with, as text: those of the start, with
    /// the live changes applied since.
    running: Settings,
    /// ... and as the node's configuration (limits before the descriptor
    /// fit at start, which lowers only limits that are not live).
    config: NodeConfig,
}

impl Reloader {
    /// Reads the command line and the config file again; when they are
    /// taken, hands the node's live limits to `hand_over` if they changed,
    /// then logs one line of what changed (applied, or needing a restart)
    /// and sets the log level. The line comes after the hand-over: an
    /// operator (or a script) that sees it can rely on the new limits for
    /// the requests it sends next. Nothing is applied when the file or a
    /// value is refused, or when the new limits do not fit together. Runs
    /// on the signal thread.
    fn reload(&mut self, hand_over: &mut dyn FnMut(LiveLimits)) {
        let Some(taken) = self.read_again() else {
            return;
        };
        if let Some(live) = taken.live {
            hand_over(live);
        }
        if taken.plan.restart.is_empty() {
            log::info!("{}", taken.line);
        } else {
            log::warn!("{}", taken.line);
        }
        // After the line: a level that hides info lines hides it otherwise.
        if taken
            .plan
            .live
            .iter()
            .any(|c| c.key == tidemark_server::reload::LOG_LEVEL)
        {
            tidemark_server::logging::set_level(taken.log.level, taken.log.fallback);
        }
    }

    /// The configuration as it is now, checked, with what changed: `None`
    /// (logged) when it is refused. Takes it as the running one.
    fn read_again(&mut self) -> Option<Reread> {
        let Some(file) = &self.file else {
            log::warn!("SIGHUP: no config file (--config) to reload; nothing changed");
            return None;
        };
        let shown = file.display().to_string();
        let refuse = |why: String| {
            log::error!(
                "config file {shown} not reloaded (SIGHUP): {why}; the node runs on with the settings it had"
            );
            None
        };
        let parsed = match parse_cli(self.argv.clone()) {
            Ok(p) => p,
            Err(ParseError::Usage(e)) => {
                return refuse(tidemark_server::config_file::first_line_of_clap_error(&e))
            }
            Err(ParseError::Config(e)) => return refuse(e.to_string()),
        };
        let (Command::Serve(args), Some(matches)) = (
            parsed.cli.command,
            parsed.matches.subcommand_matches("serve"),
        ) else {
            return refuse("the command line is no longer `serve`".into());
        };
        let log = serve_log(&args, matches);
        let new = Settings::of(&serve_command(), matches);
        let read = match node_config(args) {
            Ok(c) => c,
            Err(e) => return refuse(e),
        };
        let mut config = self.config.clone();
        let live = LiveLimits::of(&read.limits);
        live.apply_to(&mut config.limits);
        if let Err(e) = config.validate() {
            return refuse(e);
        }
        let plan = Plan::of(self.running.changes(&new));
        let line = plan.describe(&shown);
        self.running = std::mem::take(&mut self.running).with(&plan.live);
        let changed = config.limits != self.config.limits;
        self.config = config;
        Some(Reread {
            live: changed.then_some(live),
            plan,
            line,
            log,
        })
    }
}

/// A configuration read again and taken ([`Reloader::read_again`]).
struct Reread {
    /// The node's live limits, when they changed.
    live: Option<LiveLimits>,
    /// What changed: applied, or needing a restart.
    plan: Plan,
    /// The log line that says so.
    line: String,
    /// The log settings read.
    log: LogSettings,
}

/// The `serve` command, built (as when parsing).
fn serve_command() -> clap::Command {
    let mut cli = Cli::command();
    cli.build();
    cli.find_subcommand("serve")
        .expect("invariant: Cli has a serve subcommand")
        .clone()
}

/// `tidemark completions SHELL`.
fn completions(shell: clap_complete::Shell) -> Result<(), String> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "tidemark", &mut script);
    write_stdout(&script)
}

/// `tidemark man [COMMAND]`.
fn man(command: Option<&str>) -> Result<(), String> {
    let mut cli = Cli::command();
    // Built: each command's page is named `tidemark-COMMAND`.
    cli.build();
    let page = match command {
        None => cli,
        Some(name) => match cli.find_subcommand(name) {
            // Its title names the version, as the main page's does.
            Some(sub) => sub.clone().version(tidemark_server::VERSION),
            None => {
                let names: Vec<&str> = cli
                    .get_subcommands()
                    .map(|c| c.get_name())
                    .filter(|n| *n != "help")
                    .collect();
                return Err(format!(
                    "no command `{name}`; the commands: {}",
                    names.join(", ")
                ));
            }
        },
    };
    let mut roff = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut roff)
        .map_err(|e| format!("man page: {e}"))?;
    write_stdout(&roff)
}

fn write_stdout(bytes: &[u8]) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(|e| format!("standard output: {e}"))
}

/// A command line clap refused. With `--json` anywhere on it, the refusal
/// is a JSON error object like every other failure of a `--json` command
/// (clap's own text otherwise; `--help` and `--version` print as usual).
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let wants_json = std::env::args_os().skip(1).any(|a| a == "--json");
    let informational = matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if !wants_json || informational {
        e.exit();
    }
    // clap's first line is the error ("error: invalid value ..."); the rest
    // is usage advice for a human.
    let err = tidemark_server::cli::CliError::new(
        "usage",
        tidemark_server::config_file::first_line_of_clap_error(&e),
    );
    tidemark_server::cli::report_error(&err, true);
    // clap's own status for a usage error.
    ExitCode::from(2)
}

#[cfg(test)]
mod tests {
    /// The constructor ran (the test binary has it too): both options are
    /// 0 in this process. The numbers are those of mimalloc 3's option
    /// enum: its neighbours hold their distinctive defaults there
    /// (`purge_decommits` 1 after `arena_eager_commit`; `os_tag` 100,
    /// `max_errors` and `max_warnings` 32, three to five after
    /// `purge_delay`), so a vendored mimalloc whose enum moved fails here.
    /// Held by the tests that set mimalloc's options (process-wide).
    static ALLOCATOR_OPTIONS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn the_allocator_options_are_the_ones_named() {
        use super::{MI_OPTION_ARENA_EAGER_COMMIT, MI_OPTION_PURGE_DELAY};
        let _options = ALLOCATOR_OPTIONS.lock();
        use libmimalloc_sys::{mi_option_get, mi_option_set};
        // SAFETY: the getter of mimalloc's option table.
        let get = |o| unsafe { mi_option_get(o) };
        assert_eq!(get(MI_OPTION_ARENA_EAGER_COMMIT + 1), 1);
        assert_eq!(get(MI_OPTION_PURGE_DELAY + 3), 100);
        assert_eq!(get(MI_OPTION_PURGE_DELAY + 4), 32);
        assert_eq!(get(MI_OPTION_PURGE_DELAY + 5), 32);
        for (option, env, default) in [
            (MI_OPTION_PURGE_DELAY, "MIMALLOC_PURGE_DELAY", 1_000),
            (
                MI_OPTION_ARENA_EAGER_COMMIT,
                "MIMALLOC_ARENA_EAGER_COMMIT",
                2,
            ),
        ] {
            if std::env::var_os(env).is_some() {
                continue;
            }
            // SAFETY: the getter and setter of mimalloc's option table.
            unsafe {
                assert_eq!(mi_option_get(option), 0, "{env} set at load");
                mi_option_set(option, default);
                assert_eq!(mi_option_get(option), default, "{env}");
                mi_option_set(option, 0);
            }
        }
    }

    /// The loading hook keeps freed pages a second from the first load's
    /// start to the last one's end, then gives them back at once again.
    #[test]
    fn the_purge_delay_is_raised_while_a_load_runs_and_put_back_after() {
        use super::{
            purge_later_while_loading as hook, LOADING_PURGE_DELAY_MS, MI_OPTION_PURGE_DELAY,
        };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        let _options = ALLOCATOR_OPTIONS.lock();
        // SAFETY: the getter of mimalloc's option table.
        let delay = || unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(delay(), 0);
        hook(true);
        assert_eq!(delay(), LOADING_PURGE_DELAY_MS);
        hook(true);
        hook(false);
        assert_eq!(delay(), LOADING_PURGE_DELAY_MS, "one load still runs");
        hook(false);
        assert_eq!(delay(), 0);
    }

    #[test]
    fn a_metrics_port_alone_binds_loopback() {
        use super::parse_metrics_listen as p;
        let loopback = |port: u16| Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
        assert_eq!(p("9070"), loopback(9070));
        assert_eq!(p(":9070"), loopback(9070));
        assert_eq!(p("0"), loopback(0));
        assert_eq!(p("0.0.0.0:9070"), Ok("0.0.0.0:9070".parse().unwrap()));
        assert_eq!(p("[::1]:9070"), Ok("[::1]:9070".parse().unwrap()));
        for bad in ["", "x", "70000", "host:9070", ":"] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
    }

    use super::*;

    /// `tidemark serve` without flags runs with exactly the defaults of
    /// `NodeConfig::new` (both take them from the `defaults` modules).
    #[test]
    fn serve_without_flags_runs_with_the_defaults() {
        let cli = Cli::try_parse_from(["tidemark", "serve"]).expect("parses");
        let Command::Serve(args) = cli.command else {
            panic!("not serve");
        };
        assert_eq!(
            cluster_args(&args).check().expect("checks").map(|_| ()),
            None,
            "a single node"
        );
        let from_flags = node_config(args).expect("config");
        let mut defaults = NodeConfig::new(tidemark_node::defaults::DATA_DIR);
        // What only the binary knows.
        defaults.build.commit = tidemark_server::COMMIT.to_string();
        assert_eq!(format!("{from_flags:?}"), format!("{defaults:?}"));
    }

    /// `--help` explains every argument of every subcommand.
    #[test]
    fn every_argument_has_help_text() {
        fn check(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                check(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        let mut cli = Cli::command();
        cli.build();
        check(&cli, "tidemark", &mut missing);
        assert!(missing.is_empty(), "arguments without help: {missing:?}");
    }

    /// What `tidemark ARGS` runs `serve` with, as text to compare.
    fn serve_config(args: &[OsString]) -> String {
        let argv = ["tidemark", "serve"]
            .into_iter()
            .map(OsString::from)
            .chain(args.iter().cloned())
            .collect();
        let cli = match parse_cli(argv) {
            Ok(parsed) => parsed.cli,
            Err(ParseError::Usage(e)) => panic!("{args:?}: {e}"),
            Err(ParseError::Config(e)) => panic!("{args:?}: {e}"),
        };
        let Command::Serve(serve) = cli.command else {
            panic!("not serve");
        };
        let cluster = cluster_args(&serve);
        // The log's settings are the logger's, not the node's.
        let log = (serve.log_level, serve.log_format);
        format!(
            "{:?} {cluster:?} {log:?}",
            node_config(serve).expect("config")
        )
    }

    /// The serve arguments that are config keys, with their keys.
    fn keys() -> Vec<(clap::Arg, String)> {
        let keys: Vec<_> = serve_command()
            .get_arguments()
            .filter_map(|a| Some((a.clone(), tidemark_server::config_file::key_of(a)?)))
            .collect();
        assert!(keys.len() >= 20, "{} keys", keys.len());
        keys
    }

    const EXAMPLE: &str = include_str!("../tidemark.example.toml");

    /// The example file cannot go stale: it sets every flag that has a
    /// default to exactly that default, shows every other flag as a
    /// commented-out key, and loading it changes nothing.
    #[test]
    fn the_example_file_lists_every_serve_flag_with_its_default() {
        let table: toml::Table = EXAMPLE.parse().expect("the example is TOML");
        for (arg, key) in keys() {
            // config_file's invariant: the three forms it writes as flags.
            assert!(
                matches!(
                    arg.get_action(),
                    clap::ArgAction::Set | clap::ArgAction::Append | clap::ArgAction::SetTrue
                ),
                "`{key}` is a {:?} flag, which config_file does not write",
                arg.get_action()
            );
            // A switch's default is "false".
            let defaults = arg.get_default_values();
            if let Some(default) = defaults.first() {
                let listed = match table.get(&key) {
                    Some(toml::Value::Integer(i)) => i.to_string(),
                    Some(toml::Value::String(s)) => s.clone(),
                    Some(toml::Value::Boolean(b)) => b.to_string(),
                    other => panic!("example file: `{key}` is {other:?}"),
                };
                assert_eq!(listed, default.to_string_lossy(), "default of `{key}`");
            } else {
                assert!(
                    EXAMPLE
                        .lines()
                        .any(|l| l.starts_with(&format!("# {key} = "))),
                    "example file: no commented-out `# {key} = ...` for a flag without default"
                );
            }
        }
        let example = concat!(env!("CARGO_MANIFEST_DIR"), "/tidemark.example.toml");
        let loaded = serve_config(&["--config".into(), example.into()]);
        assert_eq!(loaded, serve_config(&[]));
    }

    /// Every key: its value in a file reaches the node's configuration
    /// exactly as its flag does, and the flag overrides the file (but for
    /// switches, which a flag cannot switch off).
    #[test]
    fn every_config_key_round_trips_and_its_flag_overrides_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let token = |name: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, name).expect("write token");
            path.to_string_lossy().into_owned()
        };
        let (token_a, token_b) = (token("a"), token("b"));
        let write = |key: &str, text: String| -> OsString {
            let file = dir.path().join(format!("{key}.toml"));
            std::fs::write(&file, text).expect("write config");
            file.into()
        };
        let long =
            |arg: &clap::Arg| format!("--{}", arg.get_long().expect("keys have a long flag"));
        let (switches, others): (Vec<_>, Vec<_>) = keys()
            .into_iter()
            .partition(|(arg, _)| matches!(arg.get_action(), clap::ArgAction::SetTrue));
        let defaults = serve_config(&[]);
        for (arg, key) in &switches {
            let with_file =
                serve_config(&["--config".into(), write(key, format!("{key} = true\n"))]);
            assert_eq!(
                with_file,
                serve_config(&[long(arg).into()]),
                "`{key} = true`"
            );
            assert_ne!(with_file, defaults, "`{key} = true` changed nothing");
        }
        // Every switch on, in the file and as flags alike, so that a key
        // whose flag requires a switch can be set alone.
        let switch_keys: String = switches
            .iter()
            .map(|(_, k)| format!("{k} = true\n"))
            .collect();
        let switch_flags: Vec<OsString> = switches.iter().map(|(a, _)| long(a).into()).collect();
        let flags = |more: &[&str]| -> String {
            let mut args = switch_flags.clone();
            args.extend(more.iter().map(OsString::from));
            serve_config(&args)
        };
        let baseline = flags(&[]);
        for (arg, key) in &others {
            let default = arg
                .get_default_values()
                .first()
                .map(|d| d.to_string_lossy().into_owned());
            // Two values other than the default (and each other).
            let (a, b) = match (key.as_str(), default.as_deref().map(str::parse::<u64>)) {
                ("data", _) => ("/tmp/tidemark-a".to_string(), "/tmp/tidemark-b".to_string()),
                ("listen", _) => ("127.0.0.1:1".to_string(), "127.0.0.1:2".to_string()),
                ("fsync", _) => ("never".to_string(), "interval:5".to_string()),
                ("token_file" | "cluster_token_file", _) => (token_a.clone(), token_b.clone()),
                ("metrics_listen", _) => ("127.0.0.1:1".to_string(), "127.0.0.1:2".to_string()),
                ("cluster_listen", _) => ("127.0.0.1:1".to_string(), "127.0.0.1:2".to_string()),
                ("log_level", _) => ("debug".to_string(), "trace".to_string()),
                // Two values only: the flag's overrides the file's all the same.
                ("log_format", _) => ("json".to_string(), "text".to_string()),
                ("cluster_map", _) => {
                    ("/tmp/map-a.toml".to_string(), "/tmp/map-b.toml".to_string())
                }
                ("cluster_peer", _) => (
                    "2=127.0.0.1:1,127.0.0.1:3".to_string(),
                    "3=127.0.0.1:2,127.0.0.1:4".to_string(),
                ),
                (_, Some(Ok(d))) => ((d + 1).to_string(), (d + 2).to_string()),
                // A new flag without a default: ids and counts take these.
                _ => ("1".to_string(), "2".to_string()),
            };
            let value = match a.parse::<u64>() {
                Ok(n) => n.to_string(),
                Err(_) => format!("{a:?}"),
            };
            let value = match arg.get_action() {
                clap::ArgAction::Append => format!("[{value}]"),
                _ => value,
            };
            let file = write(key, format!("{switch_keys}{key} = {value}\n"));
            let with_file = serve_config(&["--config".into(), file.clone()]);
            assert_eq!(
                with_file,
                flags(&[&long(arg), &a]),
                "`{key} = {value}` in the file"
            );
            assert_ne!(with_file, baseline, "`{key} = {value}` changed nothing");
            let both = serve_config(&["--config".into(), file, long(arg).into(), b.clone().into()]);
            assert_eq!(both, flags(&[&long(arg), &b]), "the flag overrides `{key}`");
            assert_ne!(both, with_file, "the flag overrides `{key}`");
        }
    }

    /// Every live key is a serve key, and its flag sets the live limit of
    /// its name (the names tie the reload's diff to what the node takes).
    #[test]
    fn every_live_key_is_a_serve_key_that_sets_its_limit() {
        let keys: Vec<String> = keys().into_iter().map(|(_, k)| k).collect();
        for key in tidemark_server::reload::live_keys() {
            assert!(keys.iter().any(|k| k == key), "`{key}` is no serve key");
        }
        let live_of = |args: &[&str]| {
            let cli =
                Cli::try_parse_from([&["tidemark", "serve"][..], args].concat()).expect("parses");
            let Command::Serve(a) = cli.command else {
                panic!("not serve");
            };
            LiveLimits::of(&node_config(a).expect("config").limits)
        };
        let defaults = format!("{:?}", live_of(&[]));
        for key in LiveLimits::KEYS {
            let flag = format!("--{}", key.replace('_', "-"));
            let changed = format!("{:?}", live_of(&[&flag, "12345"]));
            assert!(changed.contains(&format!("{key}: 12345")), "{changed}");
            assert!(!defaults.contains(&format!("{key}: 12345")), "{defaults}");
        }
    }

    /// `--system-sender` is repeated, and means nothing without
    /// `--send-requires-membership` (refused rather than ignored).
    #[test]
    fn system_senders_come_with_members_only_sends() {
        let parse =
            |args: &[&str]| Cli::try_parse_from([&["tidemark", "serve"][..], args].concat());
        let Ok(Cli {
            command: Command::Serve(args),
        }) = parse(&[
            "--send-requires-membership",
            "--system-sender",
            "9",
            "--system-sender",
            "3",
        ])
        else {
            panic!("parses");
        };
        let c = node_config(args).expect("config");
        assert_eq!(c.sends, tidemark_node::SendPolicy::members_only([3, 9]));
        assert!(!c.sends.needs_membership(3) && c.sends.needs_membership(4));
        assert!(parse(&["--system-sender", "9"]).is_err());
    }
}
