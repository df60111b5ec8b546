//! The one parser of sizes, durations and listen addresses for every
//! command line of the binary (`serve`, `retention`, `bench`, ...), so that
//! a value a user writes for one flag is written the same way for all:
//!
//! - a size: a bare number of bytes, or a number with `B`, `KiB`, `MiB`,
//!   `GiB` or `TiB` (`4MiB`, `256KiB`);
//! - a duration in milliseconds: a bare number of milliseconds, or a
//!   number with `ms`, `s`, `m`, `h` or `d` (`250ms`, `30s`, `7d`);
//! - a listen address: `HOST:PORT`, where HOST is an IP address or a name
//!   (`localhost:7070`, as the client commands' `--addr` takes it),
//!   resolved once, at start, to its first IPv4 address (its first address
//!   if it has none).

use std::net::{SocketAddr, ToSocketAddrs};

/// A size in bytes.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    with_unit(
        s,
        &[
            ("B", 1),
            ("KiB", 1 << 10),
            ("MiB", 1 << 20),
            ("GiB", 1 << 30),
            ("TiB", 1 << 40),
        ],
    )
}

/// A size in bytes that must fit a `u32` (a frame limit).
pub fn parse_bytes_u32(s: &str) -> Result<u32, String> {
    let n = parse_bytes(s)?;
    u32::try_from(n).map_err(|_| format!("{s:?}: at most {} bytes", u32::MAX))
}

/// A size in bytes that must fit a `usize`.
pub fn parse_bytes_usize(s: &str) -> Result<usize, String> {
    let n = parse_bytes(s)?;
    usize::try_from(n).map_err(|_| format!("{s:?}: too large for this machine"))
}

/// A duration in milliseconds.
pub fn parse_ms(s: &str) -> Result<u64, String> {
    with_unit(
        s,
        &[
            ("ms", 1),
            ("s", 1_000),
            ("m", 60_000),
            ("h", 3_600_000),
            ("d", 86_400_000),
        ],
    )
}

/// A duration in milliseconds that must fit a `u32`.
pub fn parse_ms_u32(s: &str) -> Result<u32, String> {
    let n = parse_ms(s)?;
    u32::try_from(n).map_err(|_| format!("{s:?}: at most {} ms", u32::MAX))
}

/// An address to listen on: `HOST:PORT` with an IP address or a name.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    if !s.contains(':') {
        return Err(format!("{s:?}: expected HOST:PORT (e.g. 127.0.0.1:7070)"));
    }
    let all: Vec<SocketAddr> = s
        .to_socket_addrs()
        .map_err(|e| format!("{s:?}: not an address to listen on: {e}"))?
        .collect();
    // A name with addresses of both families (localhost: 127.0.0.1 and
    // ::1) listens on its IPv4 one, which every client reaches.
    all.iter()
        .find(|a| a.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or_else(|| format!("{s:?}: the name resolves to no address"))
}

fn with_unit(s: &str, units: &[(&str, u64)]) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.trim_end_matches(|c: char| !c.is_ascii_digit());
    let unit = &t[digits.len()..];
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?}: expected a number with an optional unit"))?;
    let scale = if unit.is_empty() {
        1
    } else {
        let names: Vec<&str> = units.iter().map(|u| u.0).collect();
        units
            .iter()
            .find(|u| u.0 == unit)
            .map(|u| u.1)
            .ok_or_else(|| format!("{s:?}: unknown unit {unit:?} (one of {names:?})"))?
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{s:?}: too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_durations_and_addresses_take_units_and_names() {
        assert_eq!(parse_ms("7d"), Ok(604_800_000));
        assert_eq!(parse_ms("250ms"), Ok(250));
        assert_eq!(parse_ms("90"), Ok(90));
        assert_eq!(parse_ms("2m"), Ok(120_000));
        assert_eq!(parse_ms("30s"), Ok(30_000));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("64KiB"), Ok(65_536));
        assert_eq!(parse_bytes("100"), Ok(100));
        assert_eq!(parse_bytes_usize("4MiB"), Ok(4 << 20));
        assert_eq!(parse_bytes_u32("4MiB"), Ok(4 << 20));
        assert!(parse_bytes_u32("4GiB").is_err());
        assert!(parse_bytes("1GB").is_err());
        assert!(parse_ms("d").is_err());
        assert!(parse_ms("-1d").is_err());
        assert!(parse_bytes(&format!("{}GiB", u64::MAX)).is_err());
        assert_eq!(
            parse_listen("127.0.0.1:7070"),
            Ok("127.0.0.1:7070".parse().unwrap())
        );
        let local = parse_listen("localhost:7070").unwrap();
        assert!(local.ip().is_loopback() && local.port() == 7070);
        assert!(parse_listen("localhost").is_err());
        assert!(parse_listen("nowhere.invalid:1").is_err());
    }
}
