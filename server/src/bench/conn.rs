//! A pipelining connection for the load tool, on the same sans-IO codec as
//! [`tidemark_client::Client`], with two things the client does not do:
//! it queues many requests and writes them with one system call, and it
//! hands every response to the caller borrowed from the receive buffer
//! (records are CRC-checked by the workload, never copied). On two cores
//! the load generator shares the CPU with the node, so every system call
//! and copy it saves is measured as node throughput, as redis-benchmark and
//! `nats bench` do with their own pipelines.

use std::io::{self, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use tidemark_protocol::{
    decode_response, encode_request, FrameDecoder, Request, Response, FRAME_BYTES_MAX_FLOOR,
    PROTOCOL_VERSION_MIN,
};

pub struct Conn {
    stream: TcpStream,
    decoder: FrameDecoder,
    out: Vec<u8>,
    next_id: u64,
    /// Requests in flight the node allows on one connection.
    pub requests_in_flight_max: u32,
}

fn io_err(what: &str, e: io::Error) -> String {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!("{what}: timed out"),
        _ => format!("{what}: {e}"),
    }
}

impl Conn {
    /// Connects and says HELLO (and AUTH with `token` when the node asks).
    pub fn connect(addr: &str, token: Option<&[u8]>, io_timeout: Duration) -> Result<Conn, String> {
        let sock = addr
            .to_socket_addrs()
            .map_err(|e| format!("address {addr}: {e}"))?
            .next()
            .ok_or_else(|| format!("address {addr}: nothing to connect to"))?;
        let stream = TcpStream::connect_timeout(&sock, io_timeout)
            .map_err(|e| io_err(&format!("connect {addr}"), e))?;
        stream.set_nodelay(true).map_err(|e| io_err("nodelay", e))?;
        stream
            .set_read_timeout(Some(io_timeout))
            .map_err(|e| io_err("read timeout", e))?;
        let mut c = Conn {
            stream,
            decoder: FrameDecoder::new(FRAME_BYTES_MAX_FLOOR),
            out: Vec::with_capacity(64 << 10),
            next_id: 1,
            requests_in_flight_max: 1,
        };
        let hello = c.queue(&Request::Hello {
            // The load tool speaks version 1: its workloads send
            // messages and read them, and version 2 adds nothing to that.
            min_version: PROTOCOL_VERSION_MIN,
            max_version: PROTOCOL_VERSION_MIN,
            client_name: "tidemark-bench",
        })?;
        c.flush()?;
        let mut answer = None;
        c.wait_for(hello, &mut |r| {
            answer = Some(match r {
                Response::Hello(h) => {
                    Ok((h.auth_required, h.frame_bytes_max, h.requests_in_flight_max))
                }
                Response::Error(e) => Err(format!("HELLO refused: {:?}: {}", e.code, e.message)),
                _ => Err("unexpected answer to HELLO".to_string()),
            });
        })?;
        let (auth, frame_max, in_flight) =
            answer.ok_or_else(|| "no answer to HELLO".to_string())??;
        c.decoder = FrameDecoder::new(frame_max);
        c.requests_in_flight_max = in_flight;
        if auth {
            let token = token.ok_or("the node requires a token (--token-file)")?;
            let id = c.queue(&Request::Auth { token })?;
            c.flush()?;
            let mut ok = None;
            c.wait_for(id, &mut |r| ok = Some(matches!(r, Response::Auth)))?;
            if ok != Some(true) {
                return Err("AUTH refused".into());
            }
        }
        Ok(c)
    }

    /// Encodes a request into the output buffer; returns its request id.
    pub fn queue(&mut self, req: &Request<'_>) -> Result<u64, String> {
        let id = self.next_id;
        self.next_id += 1;
        encode_request(id, req, &mut self.out).map_err(|e| format!("encode: {e}"))?;
        Ok(id)
    }

    /// Writes every queued request (one system call for the lot).
    pub fn flush(&mut self) -> Result<(), String> {
        if self.out.is_empty() {
            return Ok(());
        }
        let r = self.stream.write_all(&self.out);
        self.out.clear();
        r.map_err(|e| io_err("write", e))
    }

    /// Waits (up to the I/O timeout) for bytes, then hands every whole
    /// frame received to `f` as `(request_id, response)`; request id 0 is a
    /// PUSH, a RESYNC or an ERROR about the connection.
    pub fn read_some(&mut self, f: &mut dyn FnMut(u64, Response<'_>)) -> Result<(), String> {
        if !self.drain(f)? {
            match self.decoder.read_from(&mut self.stream) {
                Ok(0) => return Err("the node closed the connection".into()),
                Ok(_) => {}
                Err(e) => return Err(io_err("read", e)),
            }
            self.drain(f)?;
        }
        Ok(())
    }

    /// Like [`read_some`](Self::read_some) but returns `Ok(false)` instead of
    /// failing when nothing arrives within `timeout`.
    pub fn read_within(
        &mut self,
        timeout: Duration,
        f: &mut dyn FnMut(u64, Response<'_>),
    ) -> Result<bool, String> {
        if self.drain(f)? {
            return Ok(true);
        }
        let old = self.stream.read_timeout().ok().flatten();
        self.stream
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
            .map_err(|e| io_err("read timeout", e))?;
        let r = self.decoder.read_from(&mut self.stream);
        self.stream
            .set_read_timeout(old)
            .map_err(|e| io_err("read timeout", e))?;
        match r {
            Ok(0) => Err("the node closed the connection".into()),
            Ok(_) => self.drain(f),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(io_err("read", e)),
        }
    }

    /// Takes every whole frame buffered; true if there was at least one.
    fn drain(&mut self, f: &mut dyn FnMut(u64, Response<'_>)) -> Result<bool, String> {
        let mut any = false;
        loop {
            let frame = match self.decoder.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => return Ok(any),
                Err(e) => return Err(format!("bad frame from the node: {e}")),
            };
            any = true;
            let id = frame.header.request_id;
            let resp = decode_response(&frame).map_err(|e| format!("bad response: {e}"))?;
            f(id, resp);
        }
    }

    /// Reads until the response to `id` arrived (others are dropped: only
    /// for the handshake and one-off requests with nothing else in flight).
    pub fn wait_for(&mut self, id: u64, f: &mut dyn FnMut(Response<'_>)) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut done = false;
        while !done {
            if Instant::now() > deadline {
                return Err(format!("no answer to request {id}"));
            }
            self.read_some(&mut |rid, r| {
                if rid == id {
                    done = true;
                    f(r);
                }
            })?;
        }
        Ok(())
    }

    /// One request, one response (nothing else may be in flight).
    pub fn call(
        &mut self,
        req: &Request<'_>,
        f: &mut dyn FnMut(Response<'_>),
    ) -> Result<(), String> {
        let id = self.queue(req)?;
        self.flush()?;
        self.wait_for(id, f)
    }
}
