//! A private `redis-server` per test: started on a free loopback port, killed (SIGKILL) on drop.
//! Shared with tollgate-server's tests and tollgate-lab's Redis benchmarks (they include this file by
//! path), so it uses std only.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` child process on `127.0.0.1:port`, with persistence off.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    /// More `redis-server` arguments (a replica's `--replicaof`).
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free port. Panics (failing the test, never skipping it) when
    /// `redis-server` is not installed.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server as [`start`](Self::start) does, with more `redis-server` arguments (e.g.
    /// `--rename-command FCALL ""`).
    pub fn start_with(args: &[&str]) -> RedisServer {
        let port = free_port();
        let mut server = RedisServer {
            port,
            child: None,
            extra: args.iter().map(|a| (*a).to_owned()).collect(),
        };
        server.spawn_on_a_free_port();
        server
    }

    /// Starts a replica of the server on `127.0.0.1:primary`, on a free port, and waits (10 s at
    /// most) until its link to the primary is up and the primary lists it.
    pub fn start_replica_of(primary: u16) -> RedisServer {
        // Redis 7 waits 5 s by default before a diskless full sync, for more replicas to join.
        let set = command(primary, &["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
        assert_eq!(set, "OK", "CONFIG SET on the primary");
        let port = free_port();
        let mut server = RedisServer {
            port,
            child: None,
            // The full sync straight from the socket: no RDB file in the test's directory.
            extra: [
                "--replicaof",
                "127.0.0.1",
                &primary.to_string(),
                "--repl-diskless-load",
                "on-empty-db",
            ]
            .map(str::to_owned)
            .to_vec(),
        };
        server.spawn_on_a_free_port();
        let port = server.port;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let linked = info(port, "replication").contains("master_link_status:up");
            let listed =
                info(primary, "replication").contains(&format!("port={port},state=online"));
            // After a diskless sync the primary streams writes only once the replica's first
            // REPLCONF ACK arrives (up to a second later): ready when a write is acknowledged.
            let streaming = linked
                && listed
                && commands(
                    primary,
                    &[
                        &["SET", "tollgate-test:replica-ready", "1"],
                        &["DEL", "tollgate-test:replica-ready"],
                        &["WAIT", "1", "100"],
                    ],
                )
                .get(2)
                .is_some_and(|n| n == "1");
            if streaming {
                return server;
            }
            std::thread::sleep(Duration::from_millis(10)); // polling for readiness, not a race
        }
        panic!("replica on port {port} did not link to the primary on {primary} within 10 s");
    }

    /// The child's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `redis://127.0.0.1:port/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Holds every client's commands for `ms` (`CLIENT PAUSE ms ALL`; its own reply comes at
    /// once): a stalled server.
    pub fn pause_clients(&self, ms: u64) {
        let reply = command(self.port, &["CLIENT", "PAUSE", &ms.to_string(), "ALL"]);
        assert_eq!(reply, "OK", "CLIENT PAUSE");
    }

    /// Kills the server (its data is gone: persistence is off).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Starts the server on its port and waits (10 s at most) until it answers as itself; panics
    /// otherwise.
    fn spawn(&mut self) {
        if !self.spawn_and_wait() {
            panic!(
                "redis-server on port {} did not answer as itself within 10 s",
                self.port
            );
        }
    }

    /// [`spawn`](Self::spawn) for a new server: a port chosen free may be taken before the server
    /// binds it (by another test's server, or as a client connection's ephemeral port), and the
    /// server then exits: start it again on another free port (4 tries).
    fn spawn_on_a_free_port(&mut self) {
        for _ in 1..5 {
            if self.spawn_and_wait() {
                return;
            }
            self.kill();
            self.port = free_port();
        }
        self.spawn();
    }

    /// Starts the server and waits until the Redis on its port is this child (`INFO server`'s
    /// `process_id`: not another test's server that holds the port), at most 10 s; `false` when
    /// the child exits first or the time runs out.
    fn spawn_and_wait(&mut self) -> bool {
        let mut child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start `redis-server` ({e}). These tests need a real Redis: install it \
                     (Debian/Ubuntu: `apt-get install -y redis-server`) so `redis-server` is on PATH"
                )
            });
        let answers = answers_as(self.port, &mut child);
        self.child = Some(child);
        answers
    }
}

/// A free loopback port: `--port 0` is not supported, so one the OS gave us, released and handed
/// over (it may be taken again before the server binds it: see `spawn_on_a_free_port`).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("no free loopback port")
        .port()
}

/// Whether the Redis on `127.0.0.1:port` comes to answer as `child` (its `INFO server`
/// `process_id`) within 10 s; `false` at once when `child` exits.
pub fn answers_as(port: u16, child: &mut Child) -> bool {
    let ours = format!("process_id:{}", child.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if info(port, "server").lines().any(|l| l.trim() == ours) {
            return true;
        }
        if matches!(child.try_wait(), Ok(Some(_))) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10)); // polling for readiness, not a race
    }
    false
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether a Redis on `127.0.0.1:port` answers `PING`.
pub fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// One command's reply from the Redis on `127.0.0.1:port`, as text: a status, error or integer
/// line without its type byte, or a bulk string's contents (`""` for nil or on any failure).
pub fn command(port: u16, args: &[&str]) -> String {
    commands(port, &[args]).pop().unwrap_or_default()
}

/// Several commands' replies, in order, on one connection (as [`command`]; fewer replies on a
/// failure).
pub fn commands(port: u16, each: &[&[&str]]) -> Vec<String> {
    let mut replies = Vec::new();
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return replies;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut request = String::new();
    for args in each {
        request.push_str(&format!("*{}\r\n", args.len()));
        for a in *args {
            request.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
    }
    if stream.write_all(request.as_bytes()).is_err() {
        return replies;
    }
    let mut reader = std::io::BufReader::new(stream);
    for _ in each {
        match reply(&mut reader) {
            Some(r) => replies.push(r),
            None => return replies,
        }
    }
    replies
}

/// One reply as text (an array's elements one per line); `None` when the connection fails.
fn reply(reader: &mut std::io::BufReader<TcpStream>) -> Option<String> {
    let mut line = String::new();
    if std::io::BufRead::read_line(reader, &mut line).is_err() || line.len() < 3 {
        return None;
    }
    let (kind, rest) = line.trim_end().split_at(1);
    Some(match (kind, rest.parse::<i64>()) {
        ("$", Ok(len)) if len >= 0 => {
            let len = len as usize;
            let mut body = vec![0u8; len + 2];
            reader.read_exact(&mut body).ok()?;
            body.truncate(len);
            String::from_utf8_lossy(&body).into_owned()
        }
        ("*", Ok(n)) if n >= 0 => {
            let mut items = Vec::new();
            for _ in 0..n {
                items.push(reply(reader)?);
            }
            items.join("\n")
        }
        ("$" | "*", _) => String::new(),
        _ => rest.to_owned(),
    })
}

/// `INFO section` of the Redis on `127.0.0.1:port` (`""` when it does not answer).
pub fn info(port: u16, section: &str) -> String {
    command(port, &["INFO", section])
}

/// How many times the Redis on `127.0.0.1:port` ran `command` (`INFO commandstats`, lower case; a
/// subcommand as `function|load`); 0 when it never did or does not answer.
pub fn command_calls(port: u16, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    info(port, "commandstats")
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}
