//! One connection type for a single Redis node or a Redis Cluster, for callers (such as
//! tollgate-policy's `RedisPolicy`) that take either.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// A connection to one Redis node ([`connect`](crate::connect)) or to a Redis Cluster
/// ([`connect_cluster`](crate::connect_cluster)): every limiter and [`RedisBatch`](crate::RedisBatch)
/// runs on it as on the connection it wraps. Build it with `.into()` from either.
#[derive(Clone)]
pub enum Connection {
    /// One node (or a primary behind one address), reconnecting by itself.
    Node(ConnectionManager),
    /// A cluster: each command routed by its key's slot.
    Cluster(ClusterConnection),
}

impl Connection {
    /// Whether this is a cluster connection (a request's keys in several slots then need
    /// [`RedisBatch::with_slot_groups`](crate::RedisBatch::with_slot_groups)).
    pub fn is_cluster(&self) -> bool {
        matches!(self, Connection::Cluster(_))
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Connection::Node(_) => "Connection::Node",
            Connection::Cluster(_) => "Connection::Cluster",
        })
    }
}

impl From<ConnectionManager> for Connection {
    fn from(conn: ConnectionManager) -> Self {
        Connection::Node(conn)
    }
}

impl From<ClusterConnection> for Connection {
    fn from(conn: ClusterConnection) -> Self {
        Connection::Cluster(conn)
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Node(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Node(c) => c.req_packed_commands(cmd, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Node(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}
