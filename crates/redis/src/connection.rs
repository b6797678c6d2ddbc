//! One connection type for a single Redis node or a Redis Cluster, for callers (such as
//! tollgate-policy's `RedisPolicy`) that take either.

use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use tokio::sync::OnceCell;

/// A connection to one Redis node ([`connect`](crate::connect)) or to a Redis Cluster
/// ([`connect_cluster`](crate::connect_cluster), or [`connect_cluster_lazy`](crate::connect_cluster_lazy)
/// which connects at the first command): every limiter and [`RedisBatch`](crate::RedisBatch) runs
/// on it as on the connection it wraps. Build it with `.into()` from either connection.
#[derive(Clone)]
pub enum Connection {
    /// One node (or a primary behind one address), reconnecting by itself.
    Node(ConnectionManager),
    /// A cluster: each command routed by its key's slot.
    Cluster(LazyCluster),
}

/// A cluster connection made at the first command that needs it (and tried again by the next
/// command while it cannot be made), shared by every clone.
#[derive(Clone)]
pub struct LazyCluster {
    /// `None` for a connection made already (`From<ClusterConnection>`).
    client: Option<Arc<ClusterClient>>,
    conn: Arc<OnceCell<ClusterConnection>>,
}

impl LazyCluster {
    pub(crate) fn new(client: ClusterClient) -> Self {
        LazyCluster {
            client: Some(Arc::new(client)),
            conn: Arc::new(OnceCell::new()),
        }
    }

    async fn get(&self) -> redis::RedisResult<ClusterConnection> {
        let made = self
            .conn
            .get_or_try_init(|| async {
                match &self.client {
                    Some(client) => client.get_async_connection().await,
                    None => Err(redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "no cluster client",
                    ))),
                }
            })
            .await?;
        Ok(made.clone())
    }
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
        Connection::Cluster(LazyCluster {
            client: None,
            conn: Arc::new(OnceCell::new_with(Some(conn))),
        })
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Node(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => Box::pin(async move {
                let mut conn = c.get().await?;
                conn.req_packed_command(cmd).await
            }),
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
            Connection::Cluster(c) => Box::pin(async move {
                let mut conn = c.get().await?;
                conn.req_packed_commands(cmd, offset, count).await
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Node(c) => c.get_db(),
            // A cluster has database 0 only.
            Connection::Cluster(_) => 0,
        }
    }
}
