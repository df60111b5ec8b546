//! The handshake (format-spec/protocol.md 1.7): HELLO, AUTH, and PING,
//! which every phase of a connection answers. What a handshake request
//! does to its connection (its phase, its version) is the connection's
//! business; these compute the answers.

use crate::handlers::context::Ctx;
use crate::outgoing::{error, reply, Outgoing};
use tidemark_protocol::{
    ErrorCode, HelloResponse, Response, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN,
};

/// The HELLO response's `server_name` (format-spec/protocol.md 4.1):
/// `tidemark/` and the node's major.minor version, as in the HELLO vector.
/// For logs; clients must not parse it.
pub const SERVER_NAME: &str = concat!(
    "tidemark/",
    env!("CARGO_PKG_VERSION_MAJOR"),
    ".",
    env!("CARGO_PKG_VERSION_MINOR")
);

/// HELLO (format-spec/protocol.md 4.1): the response, or the fatal
/// UNSUPPORTED_VERSION when no version is common.
/// With the response, the version chosen (section 7: the newest in both
/// ranges).
pub fn hello(
    ctx: &Ctx<'_>,
    request_id: u64,
    min_version: u8,
    max_version: u8,
) -> Result<(Outgoing, u8), Outgoing> {
    let version = PROTOCOL_VERSION.min(max_version);
    if version < min_version.max(PROTOCOL_VERSION_MIN) {
        return Err(error(
            request_id,
            ErrorCode::UnsupportedVersion,
            Some(PROTOCOL_VERSION as u64),
            "no protocol version in common",
        ));
    }
    let resp = Response::Hello(HelloResponse {
        version,
        auth_required: ctx.token.is_some(),
        frame_bytes_max: ctx.limits.frame_bytes_max,
        // Invariant: NodeConfig::validate keeps payload_bytes_max below 4 GiB.
        payload_bytes_max: ctx.engine.config().payload_bytes_max as u32,
        requests_in_flight_max: ctx.limits.requests_in_flight_max,
        server_name: SERVER_NAME,
    });
    Ok((reply(request_id, &resp, Vec::new(), 0), version))
}

/// AUTH (4.2): the response, or the fatal UNAUTHENTICATED for a wrong token
/// (compared in constant time; any token passes when the node has none).
pub fn auth(ctx: &Ctx<'_>, request_id: u64, token: &[u8]) -> Result<Outgoing, Outgoing> {
    if ctx.token.is_none_or(|t| constant_time_eq(t, token)) {
        return Ok(reply(request_id, &Response::Auth, Vec::new(), 0));
    }
    Err(error(
        request_id,
        ErrorCode::Unauthenticated,
        None,
        "wrong token",
    ))
}

/// PING (4.3).
pub fn ping(request_id: u64) -> Outgoing {
    reply(request_id, &Response::Pong, Vec::new(), 0)
}

/// Compares secrets without an early exit on the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | ((a.len() ^ b.len()) >> 8) as u8;
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret!"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}
