//! What a request must satisfy before anything is decided: at most [`MAX_DESCRIPTORS`]
//! descriptors of at most [`MAX_ENTRIES`] entries, a domain, no empty key; else a
//! [`RequestError`], and nothing is consumed.

/// Most descriptors one request may carry; more is a malformed request.
pub const MAX_DESCRIPTORS: usize = 64;
/// Most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 32;

/// Why a request could not be decided (answered with an error, not a decision).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// The domain is not configured.
    UnknownDomain(String),
    /// The request is malformed (no domain, no descriptors, an empty entry key, too many ...).
    Malformed(String),
}

/// Checks what a request must satisfy before anything is decided.
pub(crate) fn validate(
    domain: &str,
    descriptors: &[(Vec<(&str, &str)>, u64)],
) -> Result<(), RequestError> {
    if domain.is_empty() {
        return Err(RequestError::Malformed("domain is empty".into()));
    }
    if descriptors.is_empty() {
        return Err(RequestError::Malformed("no descriptors".into()));
    }
    if descriptors.len() > MAX_DESCRIPTORS {
        return Err(RequestError::Malformed(format!(
            "{} descriptors (at most {MAX_DESCRIPTORS})",
            descriptors.len()
        )));
    }
    for (i, (entries, _)) in descriptors.iter().enumerate() {
        if entries.is_empty() {
            return Err(RequestError::Malformed(format!(
                "descriptor {i} has no entries"
            )));
        }
        if entries.len() > MAX_ENTRIES {
            return Err(RequestError::Malformed(format!(
                "descriptor {i} has {} entries (at most {MAX_ENTRIES})",
                entries.len()
            )));
        }
        if entries.iter().any(|(k, _)| k.is_empty()) {
            return Err(RequestError::Malformed(format!(
                "descriptor {i} has an entry with an empty key"
            )));
        }
    }
    Ok(())
}
