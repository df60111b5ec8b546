//! tidemark-server: the `tidemark` binary's subcommands, as a library so
//! that the integration tests and the comparison benchmark
//! (`benches/compare`) drive the same code.
//!
//! - `tidemark serve` is in `main.rs`: flags into a [`tidemark_node::NodeConfig`],
//!   then [`tidemark_node::serve`] with signal handling.
//! - [`cli`]: the client commands (`send`, `pull`, ...) over the reliable
//!   client of `tidemark-client`, and `demo`'s command line.
//! - [`demo`]: the delivery-guarantee walkthrough, against an in-process
//!   node or a running one.
//! - [`bench`](mod@bench): the load tool, `tidemark bench`.
//! - [`token_file`]: the token file every command reads the same way.
//! - [`config_file`]: `tidemark serve --config FILE`, the TOML file of
//!   serve's flags.
//! - [`cluster`]: `tidemark serve --cluster-*`, a replica set member.
//! - [`signals`]: SIGINT, SIGTERM and SIGHUP for `tidemark serve`, none
//!   lost across a member's restart in place.
//! - [`reload`]: what SIGHUP's new reading of the configuration changes,
//!   and which changes a running node takes.
//! - [`logging`]: the log's level (`--log-level`, `RUST_LOG`) and format
//!   (`--log-format text|json`), and a level change at run time.
//! - [`units`]: the one parser of sizes, durations and listen addresses
//!   of every command line.

pub mod bench;
pub mod cli;
pub mod cluster;
pub mod cluster_map;
pub mod config_file;
pub mod demo;
pub mod logging;
pub mod reload;
pub mod signals;
pub mod token_file;
pub mod units;

/// The git commit the binary was built from (`unknown` outside a git
/// checkout; see `build.rs`), which INFO reports.
pub const COMMIT: &str = env!("TIDEMARK_COMMIT");

/// `tidemark --version`: the package version and the git commit the binary
/// was built from (`unknown` outside a git checkout; see `build.rs`).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TIDEMARK_COMMIT"),
    ")"
);
