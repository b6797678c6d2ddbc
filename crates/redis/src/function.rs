//! The batch script and the lease script as Redis functions (Redis 7 and later): their library is
//! loaded once per server (`FUNCTION LOAD`), then each request is one `FCALL`, which runs the
//! already defined `batch` (batch.lua) or lease (lease.lua) instead of running the whole script
//! again to define its functions, as each `EVALSHA` does (a lease call: about 126 k instructions
//! of the redis-server's by `EVALSHA`, 77 k by `FCALL`). Where functions are not there to use
//! (Redis before 7, an ACL or a renamed command that refuses `FCALL` or `FUNCTION LOAD`), calls
//! fall back to the script ([`BATCH`], [`LEASE`], by `EVALSHA`) for good; a call refused for memory
//! (`OOM`: a function that may write is refused before it runs, where the script is refused only
//! at its first write), or on a read-only replica (`READONLY`, likewise), goes by the script once.
//! Both run the same Lua on the same arguments and reply the same.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, RedisError, RedisResult, Script};

use crate::scripts::BATCH;
#[cfg(doc)]
use crate::scripts::LEASE;

/// The function library: its name and function names carry the SHA-1 of its code (the first 16
/// hex digits), so that servers shared by several versions of this crate hold one library per
/// version, each loaded with `REPLACE` without replacing another's.
#[derive(Debug)]
pub(crate) struct Library {
    /// The function that decides a batch (`FCALL <function> <numkeys> <keys> <args>`, as the
    /// script's `EVALSHA`).
    pub(crate) function: String,
    /// The function that decides several requests in one call (batch_many.lua).
    pub(crate) many: String,
    /// The function that grants a lease ([`LEASE`]'s keys and arguments).
    pub(crate) lease: String,
    /// The library's code, for `FUNCTION LOAD`.
    pub(crate) code: String,
}

/// The library: the batch script's definitions (the same files, which include the lease's:
/// tat.lua), the lease script's body as a function, `KEYS` and `ARGV` made upvalues that the
/// functions set on each call (a library has no such globals), and the functions.
pub(crate) static BATCH_LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let definitions = concat!(
        crate::scripts::batch_definitions!(),
        include_str!("lua/batch_many.lua")
    );
    let lease_body = include_str!("lua/lease.lua");
    let version = Script::new(&format!("{definitions}{lease_body}")).get_hash()[..16].to_owned();
    let name = format!("tollgate_{version}");
    let function = format!("tollgate_batch_{version}");
    let many = format!("tollgate_batch_many_{version}");
    let lease = format!("tollgate_lease_{version}");
    // The lease reads and writes straight to Redis: HELD (tat.lua) is reset, as `batch` resets
    // it, in case a failed `batch_many` left it set.
    let code = format!(
        "#!lua name={name}\nlocal KEYS, ARGV\n{definitions}\
         local function lease()\n{lease_body}\nend\n\
         redis.register_function('{function}', function(keys, args)\n  \
         KEYS, ARGV = keys, args\n  return batch()\nend)\n\
         redis.register_function('{many}', function(keys, args)\n  \
         KEYS, ARGV = keys, args\n  return batch_many()\nend)\n\
         redis.register_function('{lease}', function(keys, args)\n  \
         KEYS, ARGV = keys, args\n  HELD = nil\n  return lease()\nend)\n"
    );
    Library {
        function,
        many,
        lease,
        code,
    }
});

/// How a caller and its clones reach the library's functions ([`RedisBatch`](crate::RedisBatch)
/// a batch, [`LeasedLimiter`](crate::LeasedLimiter) a lease): by `FCALL` until the server is found
/// not to offer it, then by `EVALSHA` of the same Lua as a script.
#[derive(Debug, Default)]
pub(crate) struct LibraryCall {
    /// Set once the server refused functions: every later call goes by the script.
    script_only: AtomicBool,
    /// Held while one of this caller's calls loads the library: the calls that find it missing
    /// meanwhile (every call in flight after a restart) wait, then call again, so a burst loads it
    /// once (`FUNCTION LOAD` compiles the whole library: about 1 ms of the server's).
    loading: tokio::sync::Mutex<()>,
    /// Loads made under `loading`: a call that finds the library missing and then the count moved
    /// calls again instead of loading it again.
    loads: AtomicU64,
}

impl LibraryCall {
    /// From now on, calls go by the script only (the server refused functions).
    pub(crate) fn refused(&self) {
        // Relaxed: see script_only.
        self.script_only.store(true, Ordering::Relaxed);
    }

    /// Whether calls go by the script only (the server refused functions).
    pub(crate) fn script_only(&self) -> bool {
        // Relaxed: a hint that orders nothing else; a call racing the store sends one more FCALL,
        // refused again, and falls back again.
        self.script_only.load(Ordering::Relaxed)
    }

    /// Runs the batch on `keys` with `args` (as the script's `KEYS` and `ARGV`): see
    /// [`invoke_function`](Self::invoke_function).
    pub(crate) async fn invoke<C, T>(
        &self,
        conn: &mut C,
        keys: &[String],
        args: &[&str],
    ) -> RedisResult<T>
    where
        C: ConnectionLike,
        T: FromRedisValue,
    {
        self.invoke_function(conn, &BATCH_LIBRARY.function, &BATCH, keys, args)
            .await
    }

    /// Runs `function` of the library on `keys` with `args` (as the script's `KEYS` and `ARGV`):
    /// `FCALL`, loading the library when the server lacks it (a restart, `FUNCTION FLUSH`) and
    /// calling again; else, or where functions are refused, `script` (the same Lua) by `EVALSHA`
    /// (loading it on `NOSCRIPT`).
    pub(crate) async fn invoke_function<C, K, T>(
        &self,
        conn: &mut C,
        function: &str,
        script: &Script,
        keys: &[K],
        args: &[&str],
    ) -> RedisResult<T>
    where
        C: ConnectionLike,
        K: AsRef<str>,
        T: FromRedisValue,
    {
        if !self.script_only() {
            match self.by_function(conn, function, keys, args).await {
                Ok(reply) => return Ok(reply),
                Err(Fallback::ForGood) => self.refused(),
                Err(Fallback::Once) => {}
                Err(Fallback::Error(e)) => return Err(e),
            }
        }
        by_script(conn, script, keys, args).await
    }
}

/// `script` by `EVALSHA` on `keys` with `args`, loaded on `NOSCRIPT`.
pub(crate) async fn by_script<C, K, T>(
    conn: &mut C,
    script: &Script,
    keys: &[K],
    args: &[&str],
) -> RedisResult<T>
where
    C: ConnectionLike,
    K: AsRef<str>,
    T: FromRedisValue,
{
    let mut call = script.prepare_invoke();
    for key in keys {
        call.key(key.as_ref());
    }
    call.arg(args);
    call.invoke_async(conn).await
}

/// Why a call did not go by its function.
pub(crate) enum Fallback {
    /// The server refuses functions, or this library: the script from now on.
    ForGood,
    /// This call only (memory, a server not ready to load): the script.
    Once,
    /// The call's own answer (the batch's errors, an outage).
    Error(RedisError),
}

impl LibraryCall {
    /// `function` of the library by `FCALL`, the library loaded (`FUNCTION LOAD REPLACE`) where
    /// the server lacks it, by one of this caller's calls at a time.
    pub(crate) async fn by_function<C, K, T>(
        &self,
        conn: &mut C,
        function: &str,
        keys: &[K],
        args: &[&str],
    ) -> Result<T, Fallback>
    where
        C: ConnectionLike,
        K: AsRef<str>,
        T: FromRedisValue,
    {
        let library = &*BATCH_LIBRARY;
        // Sized up front: the command's buffers would otherwise grow (and copy) argument by
        // argument.
        let data = 16
            + function.len()
            + keys.iter().map(|k| k.as_ref().len()).sum::<usize>()
            + args.iter().map(|a| a.len()).sum::<usize>();
        let mut fcall = redis::Cmd::with_capacity(3 + keys.len() + args.len(), data);
        fcall.arg("FCALL").arg(function).arg(keys.len());
        for key in keys {
            fcall.arg(key.as_ref());
        }
        fcall.arg(args);
        // Relaxed, here and below: the count is written under `loading` and read again under it;
        // this first read only tells whether a load came after it (a stale value costs one
        // more FCALL).
        let loads = self.loads.load(Ordering::Relaxed);
        let mut result = fcall.query_async(conn).await;
        if !result.as_ref().is_err_and(not_found) {
            return result.map_err(fallback);
        }
        let _loading = self.loading.lock().await;
        if self.loads.load(Ordering::Relaxed) != loads {
            // Loaded while this call waited.
            result = fcall.query_async(conn).await;
        }
        if result.as_ref().is_err_and(not_found) {
            let load = redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg("REPLACE")
                .arg(&library.code)
                .query_async::<String>(conn)
                .await;
            if let Err(e) = load {
                return Err(match e.code() {
                    // Refused, or an error in the library (this server's Lua cannot load it).
                    Some("ERR" | "NOPERM") => Fallback::ForGood,
                    // Not now (LOADING, READONLY, TRYAGAIN and the like).
                    Some(_) => Fallback::Once,
                    None => Fallback::Error(e),
                });
            }
            self.loads.fetch_add(1, Ordering::Relaxed);
            result = fcall.query_async(conn).await;
        }
        result.map_err(fallback)
    }
}

/// How an `FCALL`'s error is taken.
fn fallback(e: RedisError) -> Fallback {
    if refused(&e) {
        Fallback::ForGood
    } else if matches!(e.code(), Some("OOM" | "READONLY")) {
        // Refused before it ran, for memory or on a read-only replica (a function that may write):
        // the script may still decide (a peek or a denial writes nothing; an admission is refused
        // at its first write, as before).
        Fallback::Once
    } else {
        Fallback::Error(e)
    }
}

/// The server lacks the library (never loaded, or gone with a restart or `FUNCTION FLUSH`).
fn not_found(e: &RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// Functions are not there to use: `FCALL` or `FUNCTION` unknown (Redis before 7, a renamed
/// command) or refused by the user's ACL.
fn refused(e: &RedisError) -> bool {
    e.code() == Some("NOPERM")
        || (e.code() == Some("ERR") && e.detail().is_some_and(|d| d.starts_with("unknown command")))
}
