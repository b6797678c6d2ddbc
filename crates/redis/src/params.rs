//! The parameters a decision script is called with, apart from what they encode (so the scripts
//! and the encodings both name them without naming each other).

use tollgate_core::Nanos;

/// A decision script's parameters: the algorithm's figures as script arguments, and the unit (in
/// nanoseconds) in which the script computes and replies its durations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptParams {
    unit: Nanos,
    args: Box<[String]>,
}

impl ScriptParams {
    /// Parameters `args` (sent as `ARGV[4..]`), durations replied in units of `unit` ns (`unit >= 1`).
    pub fn new(unit: Nanos, args: &[u64]) -> Self {
        ScriptParams {
            unit: unit.max(1),
            args: args.iter().map(u64::to_string).collect(),
        }
    }

    /// Nanoseconds per unit of the script's replies.
    pub fn unit(&self) -> Nanos {
        self.unit
    }

    /// The parameters, as sent.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// The quota tag a script stores with each state it writes under these parameters (the
    /// parameters joined by `,`): a script running under other parameters carries such a state
    /// over as-is (see [`RedisEncoding`](crate::RedisEncoding)).
    pub fn quota_tag(&self) -> String {
        self.args.join(",")
    }
}
