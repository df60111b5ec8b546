//! SIGHUP: what a new reading of `serve`'s configuration changes, and
//! which of those changes a running node takes.
//!
//! Representation: the settings a node runs with are the serve command's
//! arguments as clap resolved them (config file keys, flags over them,
//! defaults), compared per key by their raw text ([`Settings`]): a new
//! flag is compared with no code here, and is restart-only until it is
//! added to [`LIVE_KEYS`].
//!
//! A setting is live when nothing was sized, bound, opened or announced
//! from it at start: the node reads it where it is used
//! ([`tidemark_node::LiveLimits`] says which limits, and why the others
//! are not), and the log level is the logger's. Everything else (the
//! listen address, the data directory, the engine's settings, the sizes
//! HELLO announces, the descriptor budget) needs a restart: a reload
//! names it and leaves it as it was, so that the next reload names it
//! again until the node restarts.

use std::collections::BTreeMap;

use crate::config_file::key_of;

/// The live keys: the node's live limits and the log level.
pub fn is_live(key: &str) -> bool {
    key == LOG_LEVEL || tidemark_node::LiveLimits::KEYS.contains(&key)
}

/// The key of `--log-level`.
pub const LOG_LEVEL: &str = "log_level";

/// Every live key, for docs and tests.
pub fn live_keys() -> Vec<&'static str> {
    let mut keys = tidemark_node::LiveLimits::KEYS.to_vec();
    keys.push(LOG_LEVEL);
    keys
}

/// The serve settings as text, by key: each value as given (`4MiB` stays
/// `4MiB`), a repeated flag's values joined by `,`, `(none)` for a flag
/// without a value or default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings(BTreeMap<String, String>);

impl Settings {
    /// The settings `matches` (of the serve command `serve`) resolved.
    pub fn of(serve: &clap::Command, matches: &clap::ArgMatches) -> Settings {
        let mut keys = BTreeMap::new();
        for arg in serve.get_arguments() {
            let Some(key) = key_of(arg) else {
                continue;
            };
            let value = match matches.get_raw(arg.get_id().as_str()) {
                Some(raw) => raw
                    .map(|v| v.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(","),
                None => "(none)".to_string(),
            };
            keys.insert(key, value);
        }
        Settings(keys)
    }

    /// What differs from `self` in `new`, by key.
    pub fn changes(&self, new: &Settings) -> Vec<Change> {
        new.0
            .iter()
            .filter_map(|(key, value)| {
                let old = self.0.get(key).map_or("(none)", String::as_str);
                (old != value).then(|| Change {
                    key: key.clone(),
                    old: old.to_string(),
                    new: value.clone(),
                })
            })
            .collect()
    }

    /// `self` with the values of `changes` (those that were applied).
    pub fn with(mut self, changes: &[Change]) -> Settings {
        for c in changes {
            self.0.insert(c.key.clone(), c.new.clone());
        }
        self
    }
}

/// One setting whose value differs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub key: String,
    pub old: String,
    pub new: String,
}

/// The changes of one reload, split by what the node does with them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Applied now.
    pub live: Vec<Change>,
    /// Named, not applied: the node runs on with the old value.
    pub restart: Vec<Change>,
}

impl Plan {
    pub fn of(changes: Vec<Change>) -> Plan {
        let (live, restart) = changes.into_iter().partition(|c| is_live(&c.key));
        Plan { live, restart }
    }

    /// The log line of a reload of `file`.
    pub fn describe(&self, file: &str) -> String {
        let list = |changes: &[Change]| {
            changes
                .iter()
                .map(|c| format!("{} {} -> {}", c.key, c.old, c.new))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if self.live.is_empty() && self.restart.is_empty() {
            return format!("config file {file} reloaded (SIGHUP): no change");
        }
        format!(
            "config file {file} reloaded (SIGHUP): applied [{}]; need a restart, not applied [{}]",
            list(&self.live),
            list(&self.restart)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction, Command};

    fn serve() -> Command {
        Command::new("serve")
            .arg(Arg::new("config").long("config"))
            .arg(Arg::new("listen").long("listen").default_value("a:1"))
            .arg(
                Arg::new("slowlog_threshold_us")
                    .long("slowlog-threshold-us")
                    .default_value("10"),
            )
            .arg(
                Arg::new("log_level")
                    .long("log-level")
                    .default_value("info"),
            )
            .arg(Arg::new("peer").long("peer").action(ArgAction::Append))
    }

    fn settings(args: &[&str]) -> Settings {
        let m = serve()
            .no_binary_name(true)
            .try_get_matches_from(args)
            .unwrap();
        Settings::of(&serve(), &m)
    }

    #[test]
    fn changes_are_split_into_live_and_restart_only() {
        let old = settings(&["--config", "x"]);
        let new = settings(&[
            "--config",
            "y",
            "--listen",
            "b:2",
            "--slowlog-threshold-us",
            "5",
            "--log-level",
            "debug",
            "--peer",
            "1",
            "--peer",
            "2",
        ]);
        let plan = Plan::of(old.changes(&new));
        let keys = |c: &[Change]| c.iter().map(|c| c.key.clone()).collect::<Vec<_>>();
        // `config` is no key: the file names itself.
        assert_eq!(keys(&plan.live), ["log_level", "slowlog_threshold_us"]);
        assert_eq!(keys(&plan.restart), ["listen", "peer"]);
        let line = plan.describe("t.toml");
        assert!(
            line.contains("applied [log_level info -> debug, slowlog_threshold_us 10 -> 5]"),
            "{line}"
        );
        assert!(
            line.contains("not applied [listen a:1 -> b:2, peer (none) -> 1,2]"),
            "{line}"
        );
        // What was applied is the new baseline; the rest is named again.
        let running = old.with(&plan.live);
        let again = Plan::of(running.changes(&new));
        assert!(again.live.is_empty());
        assert_eq!(keys(&again.restart), ["listen", "peer"]);
        assert_eq!(
            Plan::of(new.changes(&new)).describe("t.toml"),
            "config file t.toml reloaded (SIGHUP): no change"
        );
    }
}
