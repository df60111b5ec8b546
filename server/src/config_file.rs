//! `tidemark serve --config FILE`: serve's settings in a TOML file.
//!
//! Representation: a flat TOML table whose keys are `serve`'s long flags
//! with `_` for `-` (`--frame-bytes-max` is `frame_bytes_max`), each with the
//! value the flag would take: an integer or a string (`fsync =
//! "interval:50"`, `listen = "0.0.0.0:7070"`); a boolean for a switch
//! (`send_requires_membership = true`); an array for a flag that may be
//! repeated (`system_sender = [1000, 1001]`). `server/tidemark.example.toml`
//! lists every key with its default.
//!
//! The file is turned into flags rather than into a second settings struct:
//! each key is looked up among the serve command's arguments and its value
//! run through that flag's own value parser, so the file and the command
//! line accept exactly the same values, the defaults stay in one place (the
//! `defaults` modules, through clap), and a new flag is a new key with no
//! code here. A key whose flag is also on the command line is skipped: flags
//! override the file (a repeated flag replaces the file's list; a switch
//! set in the file cannot be switched off by a flag: edit the file).
//!
//! Invariant: every serve argument that is a key is set once (`Set`),
//! repeated (`Append`) or a switch (`SetTrue`), the three forms this module
//! writes as flags; `main.rs`'s tests check it.
//!
//! Cost: one read and parse of the file and one clap parse per key, at start.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use clap::error::ErrorKind;
use clap::ArgAction;

/// The serve arguments that are not keys: the file itself, and clap's own.
const NOT_KEYS: [&str; 3] = ["config", "help", "version"];

/// Why a configuration file was refused. Each names the file; those about a
/// key name the key.
#[derive(Debug)]
pub enum ConfigFileError {
    /// The file could not be read.
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The file is not valid TOML (the message says where).
    Syntax { path: PathBuf, message: String },
    /// A key that is no `serve` flag.
    UnknownKey {
        path: PathBuf,
        key: String,
        /// The key meant, when `key` is one written with `-` for `_`.
        suggestion: Option<String>,
    },
    /// A value of a type the key's flag does not take (a float, a date or
    /// a table always; a boolean for a flag that is not a switch; an array
    /// for one that cannot be repeated).
    WrongType {
        path: PathBuf,
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    /// A value the flag's parser refuses (the same value would be refused
    /// on the command line).
    BadValue {
        path: PathBuf,
        key: String,
        value: String,
        reason: String,
    },
}

impl fmt::Display for ConfigFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigFileError::Read { path, error } => {
                write!(f, "cannot read config file {}: {error}", path.display())
            }
            ConfigFileError::Syntax { path, message } => {
                write!(
                    f,
                    "config file {} is not valid TOML: {}",
                    path.display(),
                    message.trim_end()
                )
            }
            ConfigFileError::UnknownKey {
                path,
                key,
                suggestion,
            } => {
                write!(f, "config file {}: unknown key `{key}`", path.display())?;
                match suggestion {
                    Some(s) => write!(f, " (did you mean `{s}`? keys use `_` where flags use `-`)"),
                    None => write!(
                        f,
                        " (the keys are `tidemark serve`'s flags with `_` for `-`, as in server/tidemark.example.toml)"
                    ),
                }
            }
            ConfigFileError::WrongType {
                path,
                key,
                expected,
                found,
            } => write!(
                f,
                "config file {}: key `{key}`: expected {expected}, found {found}",
                path.display()
            ),
            ConfigFileError::BadValue {
                path,
                key,
                value,
                reason,
            } => write!(
                f,
                "config file {}: key `{key}`: invalid value {value:?}: {reason}",
                path.display()
            ),
        }
    }
}

impl std::error::Error for ConfigFileError {}

/// A file turned into flags.
#[derive(Debug, Default)]
pub struct FileArgs {
    /// `--flag=value` (or `--switch`) for each key whose flag was not on
    /// the command line, in the file's key order (sorted); a repeated
    /// flag's values in the array's order.
    pub args: Vec<OsString>,
    /// The keys those came from.
    pub applied: Vec<String>,
    /// The keys skipped because their flag was on the command line.
    pub overridden: Vec<String>,
}

/// The key of a serve argument: its long flag with `_` for `-`; `None` for
/// arguments that are not keys.
pub fn key_of(arg: &clap::Arg) -> Option<String> {
    if NOT_KEYS.contains(&arg.get_id().as_str()) {
        return None;
    }
    arg.get_long().map(|long| long.replace('-', "_"))
}

/// Reads `path` and turns it into `serve` flags. `serve` is the serve
/// command (its arguments and value parsers); `on_command_line(id)` says
/// whether the argument with that id was given on the command line.
pub fn load(
    path: &Path,
    serve: &clap::Command,
    on_command_line: impl Fn(&str) -> bool,
) -> Result<FileArgs, ConfigFileError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigFileError::Read {
        path: path.to_owned(),
        error,
    })?;
    parse(path, &text, serve, on_command_line)
}

/// [`load`] of a file's text (`path` only names it in errors).
pub fn parse(
    path: &Path,
    text: &str,
    serve: &clap::Command,
    on_command_line: impl Fn(&str) -> bool,
) -> Result<FileArgs, ConfigFileError> {
    let table: toml::Table =
        text.parse()
            .map_err(|e: toml::de::Error| ConfigFileError::Syntax {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
    let mut out = FileArgs::default();
    for (key, value) in &table {
        let Some(arg) = serve
            .get_arguments()
            .find(|a| key_of(a).as_deref() == Some(key.as_str()))
        else {
            let underscored = key.replace('-', "_");
            let suggestion = serve
                .get_arguments()
                .any(|a| key_of(a).as_deref() == Some(underscored.as_str()))
                .then_some(underscored);
            return Err(ConfigFileError::UnknownKey {
                path: path.to_owned(),
                key: key.clone(),
                suggestion,
            });
        };
        let wrong_type = |expected: &'static str, found: &toml::Value| ConfigFileError::WrongType {
            path: path.to_owned(),
            key: key.clone(),
            expected,
            found: found.type_str(),
        };
        let long = arg
            .get_long()
            .expect("key_of returned a key, so the argument has a long flag");
        let flags: Vec<OsString> = match arg.get_action() {
            ArgAction::SetTrue => match value {
                toml::Value::Boolean(true) => vec![format!("--{long}").into()],
                toml::Value::Boolean(false) => Vec::new(),
                other => return Err(wrong_type("a boolean", other)),
            },
            action => {
                const ONE: &str = "an integer or a string";
                const LIST: &str = "an integer, a string or an array of them";
                let values = match (action, value) {
                    (ArgAction::Append, toml::Value::Array(items)) => items
                        .iter()
                        .map(|v| scalar(v).ok_or_else(|| wrong_type(LIST, v)))
                        .collect::<Result<Vec<_>, _>>()?,
                    (ArgAction::Append, v) => vec![scalar(v).ok_or_else(|| wrong_type(LIST, v))?],
                    (_, v) => vec![scalar(v).ok_or_else(|| wrong_type(ONE, v))?],
                };
                let mut flags = Vec::new();
                for value in values {
                    let flag = OsString::from(format!("--{long}={value}"));
                    check_value(serve, &flag).map_err(|reason| ConfigFileError::BadValue {
                        path: path.to_owned(),
                        key: key.clone(),
                        value,
                        reason,
                    })?;
                    flags.push(flag);
                }
                flags
            }
        };
        if on_command_line(arg.get_id().as_str()) {
            out.overridden.push(key.clone());
        } else {
            out.args.extend(flags);
            out.applied.push(key.clone());
        }
    }
    Ok(out)
}

/// A TOML integer or string as a flag's value.
fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// Runs the flag's own parser on `flag` (`--name=value`) alone, so that a
/// refusal names the key rather than a flag the user never typed. Only the
/// value is judged here: what one flag needs of the others (`requires`,
/// conflicts) is checked when the whole command line is parsed.
fn check_value(serve: &clap::Command, flag: &OsString) -> Result<(), String> {
    match serve
        .clone()
        .no_binary_name(true)
        .try_get_matches_from([flag])
    {
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::InvalidValue | ErrorKind::ValueValidation | ErrorKind::InvalidUtf8
            ) =>
        {
            Err(std::error::Error::source(&e)
                .map(ToString::to_string)
                .unwrap_or_else(|| first_line_of_clap_error(&e)))
        }
        _ => Ok(()),
    }
}

/// clap's message without its `error: ` prefix and usage advice.
pub fn first_line_of_clap_error(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, Command};

    fn serve() -> Command {
        Command::new("serve")
            .arg(
                Arg::new("frame_bytes_max")
                    .long("frame-bytes-max")
                    .value_parser(clap::value_parser!(u32))
                    .default_value("100"),
            )
            .arg(Arg::new("listen").long("listen").default_value("x"))
            .arg(Arg::new("config").long("config"))
            .arg(
                Arg::new("strict")
                    .long("strict")
                    .action(clap::ArgAction::SetTrue),
            )
            .arg(
                Arg::new("senders")
                    .long("sender")
                    .action(clap::ArgAction::Append)
                    .value_parser(clap::value_parser!(u64))
                    .requires("strict"),
            )
    }

    fn parse_text(text: &str, given: &[&str]) -> Result<FileArgs, ConfigFileError> {
        parse(Path::new("t.toml"), text, &serve(), |id| {
            given.contains(&id)
        })
    }

    #[test]
    fn keys_become_flags_unless_the_flag_was_given() {
        let a = parse_text("frame_bytes_max = 7\nlisten = \"a:1\"\n", &["listen"]).unwrap();
        assert_eq!(a.args, vec![OsString::from("--frame-bytes-max=7")]);
        assert_eq!(a.applied, vec!["frame_bytes_max"]);
        assert_eq!(a.overridden, vec!["listen"]);
    }

    #[test]
    fn switches_are_booleans_and_repeated_flags_arrays() {
        // `sender` requires `strict`: only the value is judged per key.
        let a = parse_text("sender = [3, 4]\nstrict = true\n", &[]).unwrap();
        assert_eq!(
            a.args,
            vec![
                OsString::from("--sender=3"),
                OsString::from("--sender=4"),
                OsString::from("--strict"),
            ]
        );
        let a = parse_text("sender = 3\nstrict = false\n", &["senders"]).unwrap();
        assert_eq!(a.args, Vec::<OsString>::new());
        assert_eq!(a.applied, vec!["strict"]);
        assert_eq!(a.overridden, vec!["sender"]);
    }

    #[test]
    fn refusals_name_the_key() {
        let e = parse_text("frame_byte_max = 1", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown key `frame_byte_max`"), "{e}");
        let e = parse_text("frame-bytes-max = 1", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("did you mean `frame_bytes_max`"), "{e}");
        // The file cannot name another file.
        let e = parse_text("config = \"a\"", &[]).unwrap_err();
        assert!(matches!(e, ConfigFileError::UnknownKey { .. }), "{e}");
        let e = parse_text("frame_bytes_max = -1", &[]).unwrap_err();
        assert!(
            matches!(&e, ConfigFileError::BadValue { key, value, .. } if key == "frame_bytes_max" && value == "-1"),
            "{e}"
        );
        // A value out of the flag's range is refused as on the command line,
        // even when the flag is given too (the file is wrong either way).
        let e = parse_text("frame_bytes_max = 5000000000", &["frame_bytes_max"]).unwrap_err();
        assert!(e.to_string().contains("key `frame_bytes_max`"), "{e}");
        let e = parse_text("frame_bytes_max = 1.5", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("key `frame_bytes_max`: expected an integer or a string, found float"),
            "{e}"
        );
        let e = parse_text("strict = 1", &[]).unwrap_err().to_string();
        assert!(
            e.contains("key `strict`: expected a boolean, found integer"),
            "{e}"
        );
        let e = parse_text("sender = [1, true]", &[])
            .unwrap_err()
            .to_string();
        let want = "key `sender`: expected an integer, a string or an array of them, found boolean";
        assert!(e.contains(want), "{e}");
        let e = parse_text("listen = [\"a\"]", &[]).unwrap_err().to_string();
        assert!(
            e.contains("key `listen`: expected an integer or a string, found array"),
            "{e}"
        );
        let e = parse_text("sender = [1, -2]", &[]).unwrap_err();
        assert!(
            matches!(&e, ConfigFileError::BadValue { key, value, .. } if key == "sender" && value == "-2"),
            "{e}"
        );
        let e = parse_text("[serve]\nlisten = \"a\"", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown key `serve`"), "{e}");
        let e = parse_text("listen = ", &[]).unwrap_err();
        assert!(matches!(e, ConfigFileError::Syntax { .. }), "{e}");
        let e = load(Path::new("/nonexistent/t.toml"), &serve(), |_| false).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("cannot read config file /nonexistent/t.toml"),
            "{e}"
        );
    }
}
