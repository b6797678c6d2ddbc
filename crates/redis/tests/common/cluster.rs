//! A private Redis Cluster per test: 3 masters + 3 replicas of `redis-server --cluster-enabled yes` on
//! free loopback ports, each in its own temporary directory, joined with `redis-cli --cluster
//! create`; every node killed by PID (SIGKILL) and its directory removed on drop.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Redis Cluster's slot of `key`: CRC16/XMODEM of the key (or of its `{hash tag}`) mod 16384.
pub fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = key.find('{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(bytes)) % 16384
}

/// A key starting with `stem` whose slot is `slot` (found by trying suffixes: about 16 384 tries).
pub fn key_in_slot(stem: &str, slot_wanted: u16) -> String {
    (0u64..)
        .map(|i| format!("{stem}{i}"))
        .find(|k| slot(k) == slot_wanted)
        .expect("every slot is reachable")
}

/// One node of the cluster.
pub struct Node {
    pub port: u16,
    bus_port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

/// What `CLUSTER NODES` says about one node.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub id: String,
    pub port: u16,
    pub master: bool,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    pub failed: bool,
    /// Slot ranges served (masters).
    pub slots: Vec<(u16, u16)>,
}

/// A running 6-node cluster.
pub struct RedisCluster {
    pub nodes: Vec<Node>,
    node_timeout: Duration,
}

static CLUSTER_SEQ: AtomicU32 = AtomicU32::new(0);

/// `n` distinct free loopback ports (held open until all are chosen, so none repeats).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("no free loopback port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

impl RedisCluster {
    /// Starts 3 masters + 3 replicas with `cluster-node-timeout` = `node_timeout` and waits until
    /// every node reports `cluster_state:ok` and every replica's link to its master is up. Panics
    /// (failing the test) when `redis-server`/`redis-cli` are missing or the cluster does not form
    /// within 30 s.
    pub fn start(node_timeout: Duration) -> RedisCluster {
        let ports = free_ports(12);
        let seq = CLUSTER_SEQ.fetch_add(1, Ordering::Relaxed); // Relaxed: a unique number only
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            node_timeout,
        };
        for i in 0..6 {
            let dir = std::env::temp_dir().join(format!(
                "tollgate-cluster-{}-{seq}-{stamp}-{i}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).expect("temp dir");
            let mut node = Node {
                port: ports[2 * i],
                bus_port: ports[2 * i + 1],
                dir,
                child: None,
            };
            node.spawn(node_timeout);
            cluster.nodes.push(node);
        }
        for node in &mut cluster.nodes {
            // A port chosen free may be taken before the node binds it (by another test's server,
            // or as a client connection's ephemeral port): the node then exits. Start it again on
            // two other ports (the cluster is not formed yet, so no other node knows them).
            let mut starts = 1;
            while !node.answers() {
                assert!(
                    starts < 5,
                    "cluster node on port {} did not answer (log: {})",
                    node.port,
                    node.log_path().display()
                );
                node.kill();
                let ports = free_ports(2);
                (node.port, node.bus_port) = (ports[0], ports[1]);
                node.spawn(node_timeout);
                starts += 1;
            }
        }
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("cannot run `redis-cli` (install redis-tools / redis-server)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    }

    /// `redis://127.0.0.1:port/` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}/", n.port))
            .collect()
    }

    /// Runs `redis-cli -p port args...` and returns its stdout (panics on failure to run).
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        cli(port, args)
    }

    /// The cluster as node `port` sees it.
    pub fn topology(&self, port: u16) -> Vec<NodeInfo> {
        parse_nodes(&cli(port, &["CLUSTER", "NODES"]))
    }

    /// The live nodes' ports.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// Batch calls so far over every live node (`INFO commandstats`): `fcall` and `evalsha`, since
    /// a batch goes by FCALL on Redis 7 and later and by EVALSHA before.
    pub fn batch_calls(&self) -> u64 {
        self.command_calls("evalsha") + self.command_calls("fcall")
    }

    /// How many times the live nodes ran `command` so far (`INFO commandstats`, lower case).
    pub fn command_calls(&self, command: &str) -> u64 {
        self.live_ports()
            .into_iter()
            .map(|port| super::command_calls(port, command))
            .sum()
    }

    /// The master serving `slot`, as the first live node sees it.
    pub fn master_of(&self, slot: u16) -> NodeInfo {
        let port = self.live_ports()[0];
        self.topology(port)
            .into_iter()
            .find(|n| n.master && !n.failed && n.slots.iter().any(|&(a, b)| a <= slot && slot <= b))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// Kills the node on `port` with SIGKILL.
    pub fn kill(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("no such node");
        node.kill();
    }

    /// Waits until every live node reports `cluster_state:ok` with all 16384 slots served by a
    /// master that is not failed, and every live replica's link is up.
    pub fn wait_healthy(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if self.is_healthy() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "cluster not healthy within {within:?}: {}",
                cli(self.live_ports()[0], &["CLUSTER", "NODES"])
            );
            std::thread::sleep(Duration::from_millis(20)); // polling the servers, not a race
        }
    }

    fn is_healthy(&self) -> bool {
        self.live_ports().iter().all(|&port| {
            let info = cli(port, &["CLUSTER", "INFO"]);
            if !info.contains("cluster_state:ok") || !info.contains("cluster_slots_ok:16384") {
                return false;
            }
            let nodes = parse_nodes(&cli(port, &["CLUSTER", "NODES"]));
            let served: u32 = nodes
                .iter()
                .filter(|n| n.master && !n.failed)
                .flat_map(|n| n.slots.iter())
                .map(|&(a, b)| u32::from(b - a) + 1)
                .sum();
            let me = nodes.iter().find(|n| n.port == port);
            let replica_ok = match me {
                Some(n) if !n.master => {
                    cli(port, &["INFO", "replication"]).contains("master_link_status:up")
                }
                Some(_) => true,
                None => false,
            };
            served == 16384 && replica_ok
        })
    }

    /// Moves `slot` from its master to the master on `to_port` by hand, as `redis-cli --cluster
    /// reshard` does: `SETSLOT IMPORTING` on the target, `SETSLOT MIGRATING` on the source, `MIGRATE`
    /// of its keys `batch` at a time (calling `between` after each batch), then `SETSLOT NODE` on
    /// every master. Returns how many keys moved.
    pub fn migrate_slot(
        &self,
        slot: u16,
        to_port: u16,
        batch: usize,
        mut between: impl FnMut(),
    ) -> usize {
        let from = self.master_of(slot);
        let to = self
            .topology(to_port)
            .into_iter()
            .find(|n| n.port == to_port)
            .expect("target in its own view");
        assert!(to.master && from.port != to.port);
        let s = slot.to_string();
        ok(cli(
            to.port,
            &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from.id],
        ));
        ok(cli(
            from.port,
            &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to.id],
        ));
        let mut moved = 0;
        loop {
            let keys = cli(
                from.port,
                &["CLUSTER", "GETKEYSINSLOT", &s, &batch.to_string()],
            );
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let port = to.port.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().copied());
            // NOKEY: every key of the batch expired meanwhile (fine, as for redis-cli).
            let reply = cli(from.port, &args);
            assert!(
                matches!(reply.trim(), "OK" | "NOKEY"),
                "MIGRATE replied {reply:?}"
            );
            moved += keys.len();
            between();
        }
        // The target first, then the source, then everyone else (redis-cli's order).
        ok(cli(to.port, &["CLUSTER", "SETSLOT", &s, "NODE", &to.id]));
        ok(cli(from.port, &["CLUSTER", "SETSLOT", &s, "NODE", &to.id]));
        for n in self.topology(to.port) {
            if n.master && !n.failed && n.port != to.port && n.port != from.port {
                ok(cli(n.port, &["CLUSTER", "SETSLOT", &s, "NODE", &to.id]));
            }
        }
        moved
    }

    /// The lines of node `port`'s log that mention replication or failover (sync, resync, FAIL,
    /// election, epoch, role changes), for a test to print when something unexpected happened.
    pub fn log_excerpt(&self, port: u16) -> String {
        let node = self
            .nodes
            .iter()
            .find(|n| n.port == port)
            .expect("no such node");
        let text = std::fs::read_to_string(node.log_path()).unwrap_or_default();
        const WORDS: [&str; 9] = [
            "sync", "SYNC", "FAIL", "ailover", "lection", "Epoch", "MASTER", "REPLICA", "master",
        ];
        text.lines()
            .filter(|l| WORDS.iter().any(|w| l.contains(w)))
            .map(|l| format!("  {port}: {l}\n"))
            .collect()
    }

    /// The configured `cluster-node-timeout`.
    pub fn node_timeout(&self) -> Duration {
        self.node_timeout
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
            let _ = std::fs::remove_dir_all(&node.dir);
        }
    }
}

impl Node {
    fn spawn(&mut self, node_timeout: Duration) {
        let conf = self.dir.join("nodes.conf");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--cluster-port", &self.bus_port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--cluster-enabled", "yes"])
            .arg("--cluster-config-file")
            .arg(&conf)
            .args([
                "--cluster-node-timeout",
                &node_timeout.as_millis().to_string(),
            ])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.log_path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start `redis-server` ({e}). These tests need a real Redis: install it \
                     (Debian/Ubuntu: `apt-get install -y redis-server`)"
                )
            });
        self.child = Some(child);
    }

    /// The node's log: in its own directory (removed with it), or `DIR/redis-PORT.log` when
    /// `TOLLGATE_CLUSTER_LOGS=DIR` is set, to keep every node's log after the run.
    fn log_path(&self) -> PathBuf {
        match std::env::var_os("TOLLGATE_CLUSTER_LOGS") {
            Some(dir) => PathBuf::from(dir).join(format!("redis-{}.log", self.port)),
            None => self.dir.join("redis.log"),
        }
    }

    /// Whether the node comes to answer as itself within 10 s (not another test's server on its
    /// port); `false` at once when its process has exited.
    fn answers(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| super::answers_as(self.port, child))
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
        }
    }
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("cannot run `redis-cli`");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ok(reply: String) {
    assert_eq!(reply.trim(), "OK", "redis-cli replied {reply:?}");
}

fn parse_nodes(text: &str) -> Vec<NodeInfo> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            // <id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slot> ...
            let port = f[1].split('@').next()?.rsplit(':').next()?.parse().ok()?;
            let flags = f[2];
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|a| (a, a)),
                })
                .collect();
            Some(NodeInfo {
                id: f[0].to_owned(),
                port,
                master: flags.contains("master"),
                master_id: (f[3] != "-").then(|| f[3].to_owned()),
                failed: flags.contains("fail") && !flags.contains("fail?"),
                slots,
            })
        })
        .collect()
}
