//! The Lua scripts, their parameters in microseconds, and their replies.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Script;
use tollgate_core::{Decision, Nanos};

use crate::breaker::{Admission, Breaker, Outcome};
use crate::config::{RedisConfig, TimeSource};
use crate::error::Error;
use crate::function::{LibraryCall, by_script};
use crate::params::ScriptParams;

/// Integers the scripts handle stay below 2^53 (exact in a Lua double). Parameters are held below
/// 2^52 so that `now` (about 2^50.6 µs today) plus any of them stays exact until the year 2112.
pub(crate) const LUA_PARAM_MAX: u64 = 1 << 52;

macro_rules! lua {
    ($($file:literal),+) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("lua/prelude.lua"),
                $(include_str!(concat!("lua/", $file))),+
            ))
        })
    };
}

pub(crate) static GCRA: LazyLock<Script> = lua!("tat.lua", "gcra.lua");
pub(crate) static LEASE: LazyLock<Script> = lua!("tat.lua", "lease.lua");
pub(crate) static FIXED_WINDOW: LazyLock<Script> =
    lua!("fixed_window_decide.lua", "fixed_window.lua");
pub(crate) static SLIDING_WINDOW: LazyLock<Script> =
    lua!("sliding_window_decide.lua", "sliding_window.lua");
/// The batch's definitions (the `*_decide` functions and `batch`), for its script ([`BATCH`]) and
/// its function library (`function.rs`) alike.
macro_rules! batch_definitions {
    () => {
        concat!(
            include_str!("lua/prelude.lua"),
            include_str!("lua/tat.lua"),
            include_str!("lua/fixed_window_decide.lua"),
            include_str!("lua/sliding_window_decide.lua"),
            include_str!("lua/batch.lua"),
        )
    };
}
pub(crate) use batch_definitions;

/// Several keys of any of the algorithms above in one call: the same `*_decide` functions.
pub(crate) static BATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        batch_definitions!(),
        include_str!("lua/batch_eval.lua")
    ))
});
pub(crate) static GCRA_REFUND: LazyLock<Script> =
    lua!("tat.lua", "tat_settle.lua", "gcra_refund.lua");
pub(crate) static FIXED_WINDOW_REFUND: LazyLock<Script> = lua!(
    "fixed_window_decide.lua",
    "fixed_window_settle.lua",
    "fixed_window_refund.lua"
);
pub(crate) static SLIDING_WINDOW_REFUND: LazyLock<Script> = lua!(
    "sliding_window_decide.lua",
    "sliding_window_settle.lua",
    "sliding_window_refund.lua"
);
pub(crate) static GCRA_CHARGE: LazyLock<Script> =
    lua!("tat.lua", "tat_settle.lua", "gcra_charge.lua");
pub(crate) static FIXED_WINDOW_CHARGE: LazyLock<Script> = lua!(
    "fixed_window_decide.lua",
    "fixed_window_settle.lua",
    "fixed_window_charge.lua"
);
pub(crate) static SLIDING_WINDOW_CHARGE: LazyLock<Script> = lua!(
    "sliding_window_decide.lua",
    "sliding_window_settle.lua",
    "sliding_window_charge.lua"
);
/// A reserved request's settlement: several keys of any of the algorithms, each given units back
/// or charged, in one call (the same `*_refund` and `*_charge` functions as the single-key scripts).
pub(crate) static SETTLE: LazyLock<Script> = lua!(
    "tat.lua",
    "fixed_window_decide.lua",
    "sliding_window_decide.lua",
    "tat_settle.lua",
    "fixed_window_settle.lua",
    "sliding_window_settle.lua",
    "settle.lua"
);

/// The script's first argument: `now` in µs, or `""` for the server's `TIME`.
pub(crate) fn time_arg(config: &RedisConfig, now: Option<Nanos>) -> String {
    match (now, config.time()) {
        (Some(now), _) => (now / 1000).to_string(),
        (None, TimeSource::Server) => String::new(),
        (None, TimeSource::System) => {
            let since = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or(Duration::ZERO);
            since.as_micros().to_string()
        }
    }
}

/// A script reply `{a, b, retry, reset}`, durations converted from the script's unit to nanoseconds
/// (-1: never).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reply {
    pub a: u64,
    pub b: u64,
    pub retry: Nanos,
    pub reset: Nanos,
}

impl Reply {
    pub(crate) fn parse(raw: &[i64], unit: Nanos) -> Result<Reply, Error> {
        let &[a, b, retry, reset] = raw else {
            return Err(Error::BadReply(format!("{} values, want 4", raw.len())));
        };
        let count = |v: i64| u64::try_from(v).map_err(|_| Error::BadReply(format!("count {v}")));
        let us = |v: i64| match v {
            -1 => Ok(Nanos::MAX),
            v => u64::try_from(v)
                .map(|n| n.saturating_mul(unit))
                .map_err(|_| Error::BadReply(format!("duration {v}"))),
        };
        Ok(Reply {
            a: count(a)?,
            b: count(b)?,
            retry: us(retry)?,
            reset: us(reset)?,
        })
    }

    /// For the decision scripts: `a` = allowed (0/1), `b` = remaining.
    pub(crate) fn decision(self) -> Decision {
        if self.a != 0 {
            Decision::allowed(self.b, self.reset)
        } else {
            Decision::denied(self.retry, self.reset)
        }
    }
}

/// The Lua a call runs: a script by `EVALSHA`, or a function of the library by `FCALL` with the
/// same Lua as a script to fall back on (see [`LibraryCall`]).
#[derive(Clone, Copy)]
pub(crate) enum Lua<'a> {
    Script(&'a Script),
    Function {
        via: &'a LibraryCall,
        name: &'a str,
        script: &'a Script,
    },
}

/// Runs `lua` on one key (EVALSHA, loading the script on NOSCRIPT; or FCALL, loading the library
/// when the server lacks it) under the configured timeout, with arguments `head` (time, and two
/// per script) then the algorithm's parameters; unless `breaker` is open, in which case
/// [`Error::CircuitOpen`] comes back at once.
pub(crate) async fn invoke<C>(
    conn: &C,
    breaker: &Breaker,
    config: &RedisConfig,
    lua: Lua<'_>,
    key: &str,
    head: [&str; 3],
    params: &ScriptParams,
) -> Result<Reply, Error>
where
    C: redis::aio::ConnectionLike + Clone + Send,
{
    if breaker.admit() == Admission::Reject {
        return Err(Error::CircuitOpen);
    }
    let result = call(conn, config, lua, key, head, params).await;
    breaker.record(match &result {
        Err(e) if e.is_outage() => Outcome::Failed,
        _ => Outcome::Answered,
    });
    result
}

async fn call<C>(
    conn: &C,
    config: &RedisConfig,
    lua: Lua<'_>,
    key: &str,
    head: [&str; 3],
    params: &ScriptParams,
) -> Result<Reply, Error>
where
    C: redis::aio::ConnectionLike + Clone + Send,
{
    let mut conn = conn.clone();
    let keys = [config.key(key)];
    let mut args = Vec::with_capacity(head.len() + params.args().len());
    args.extend(head);
    args.extend(params.args().iter().map(String::as_str));
    let sent = async {
        match lua {
            Lua::Function { via, name, script } => {
                via.invoke_function(&mut conn, name, script, &keys, &args)
                    .await
            }
            Lua::Script(script) => by_script(&mut conn, script, &keys, &args).await,
        }
    };
    let reply: Vec<i64> = tokio::time::timeout(config.timeout(), sent)
        .await
        .map_err(|_| Error::Timeout(config.timeout()))?
        .map_err(|e| classify(e, config, key))?;
    Reply::parse(&reply, params.unit())
}

/// A Redis error as the crate's [`Error`]: the scripts' `TOLLGATE_CORRUPT` and Redis's `WRONGTYPE`
/// are the key's fault, not the connection's.
pub(crate) fn classify(e: redis::RedisError, config: &RedisConfig, key: &str) -> Error {
    // The connection's own response timeout (set by `connect`) is the same timeout.
    if e.is_timeout() {
        return Error::Timeout(config.timeout());
    }
    let key = config.key(key);
    // Redis appends where the error was raised (" script: <sha>, on @user_script:<line>.").
    let detail = |e: &redis::RedisError| {
        let d = e.detail().unwrap_or("");
        d.split(" script: ").next().unwrap_or(d).to_owned()
    };
    match e.code() {
        Some("TOLLGATE_CORRUPT") => {
            let d = detail(&e);
            let reason = d
                .strip_prefix(key.as_str())
                .and_then(|r| r.strip_prefix(": "))
                .map_or(d.clone(), str::to_owned);
            Error::CorruptState { key, reason }
        }
        Some("WRONGTYPE") => Error::WrongType {
            detail: detail(&e),
            key,
        },
        _ => Error::Redis(e),
    }
}
