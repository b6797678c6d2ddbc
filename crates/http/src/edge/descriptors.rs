//! [`DescriptorNames`]: the descriptor each request fact becomes, and the descriptors of one
//! request built on the stack ([`with_descriptors`]).

use std::cell::OnceCell;
use std::fmt;

use http::HeaderMap;
use http::header::HeaderName;
use tollgate_policy::DescriptorSchema;

use super::addr_text::AddrText;
use crate::facts::RequestFacts;
use crate::key::ClientIp;

/// Headers one request can turn into descriptors (beside the client address, route and method).
pub(crate) const MAX_HEADER_DESCRIPTORS: usize = 13;
/// Descriptors one request can carry.
const MAX_DESCRIPTORS: usize = MAX_HEADER_DESCRIPTORS + 3;

/// A header name that is not a valid HTTP field name, or more headers than a request can carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorSourceError {
    header: String,
}

impl fmt::Display for DescriptorSourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "header `{}` cannot be a descriptor source (not a field name, or more than \
             {MAX_HEADER_DESCRIPTORS} headers)",
            self.header
        )
    }
}

impl std::error::Error for DescriptorSourceError {}

/// The descriptor each request fact becomes: the one place descriptor names are set, for every
/// HTTP edge.
///
/// Defaults: the client address as `remote_address` (when the edge has a [`ClientIp`]), the path
/// as `route`, the method as `method`, no headers.
///
/// ```
/// use tollgate_http::DescriptorNames;
/// let names = DescriptorNames::default()
///     .route(Some("path"))
///     .method(None)
///     .header("x-api-key", "api_key")?;
/// # let _ = names;
/// # Ok::<(), tollgate_http::DescriptorSourceError>(())
/// ```
#[derive(Clone, Debug)]
pub struct DescriptorNames {
    client: Option<Box<str>>,
    route: Option<Box<str>>,
    method: Option<Box<str>>,
    headers: Vec<(HeaderName, Box<str>)>,
    /// The names above that are set, in descriptor order, for
    /// [`Policy::check_next_by_at`](tollgate_policy::Policy::check_next_by_at);
    /// `sources[i]` is where name `i`'s value comes from. Rebuilt by every setter.
    schema: DescriptorSchema,
    sources: Vec<Source>,
}

/// Where a [`DescriptorNames`] schema position's value comes from.
#[derive(Clone, Copy, Debug)]
enum Source {
    Client,
    Route,
    Method,
    /// `headers[i]`.
    Header(usize),
}

impl Default for DescriptorNames {
    fn default() -> Self {
        DescriptorNames {
            client: Some("remote_address".into()),
            route: Some("route".into()),
            method: Some("method".into()),
            headers: Vec::new(),
            schema: DescriptorSchema::default(),
            sources: Vec::new(),
        }
        .with_schema()
    }
}

impl DescriptorNames {
    /// The descriptor name for the client address (`remote_address` by default; `None` leaves it
    /// out).
    pub fn client(mut self, name: Option<&str>) -> Self {
        self.client = name.map(Into::into);
        self.with_schema()
    }

    /// The descriptor name for the path (`route` by default; `None` leaves it out).
    pub fn route(mut self, name: Option<&str>) -> Self {
        self.route = name.map(Into::into);
        self.with_schema()
    }

    /// The descriptor name for the method (`method` by default; `None` leaves it out).
    pub fn method(mut self, name: Option<&str>) -> Self {
        self.method = name.map(Into::into);
        self.with_schema()
    }

    /// Sets `schema` and `sources` from the names, in the order `with_descriptors` lists them.
    fn with_schema(mut self) -> Self {
        let fixed = [
            (self.client.as_deref(), Source::Client),
            (self.route.as_deref(), Source::Route),
            (self.method.as_deref(), Source::Method),
        ];
        let named: Vec<(&str, Source)> = fixed
            .into_iter()
            .filter_map(|(name, source)| Some((name?, source)))
            .chain(
                self.headers
                    .iter()
                    .enumerate()
                    .map(|(i, (_, name))| (&**name, Source::Header(i))),
            )
            .collect();
        let schema = DescriptorSchema::new(named.iter().map(|(name, _)| *name));
        self.sources = named.into_iter().map(|(_, source)| source).collect();
        self.schema = schema;
        self
    }

    /// Request header `header` (an API key, a tenant id) as descriptor `name`; an absent, empty
    /// or non-text value leaves the descriptor out.
    ///
    /// # Errors
    /// [`DescriptorSourceError`] for an invalid field name, or past 13 headers.
    pub fn header(mut self, header: &str, name: &str) -> Result<Self, DescriptorSourceError> {
        let err = || DescriptorSourceError {
            header: header.to_owned(),
        };
        if self.headers.len() == MAX_HEADER_DESCRIPTORS {
            return Err(err());
        }
        let header = HeaderName::try_from(header).map_err(|_| err())?;
        self.headers.push((header, name.into()));
        Ok(self.with_schema())
    }

    /// The names that are set, in descriptor order (what a policy's rules are resolved against).
    #[inline]
    pub(super) fn schema(&self) -> &DescriptorSchema {
        &self.schema
    }

    /// The value of schema position `i` for `facts`, as `with_descriptors` lists it; the client
    /// address's text is worked out once, into `client`, and only when asked for.
    #[inline]
    pub(super) fn value<'a>(
        &self,
        i: usize,
        client_ip: Option<&ClientIp>,
        facts: &RequestFacts<'a>,
        client: &'a OnceCell<Option<AddrText>>,
    ) -> Option<&'a str> {
        match *self.sources.get(i)? {
            Source::Client => client
                .get_or_init(|| client_text(client_ip, facts))
                .as_ref()
                .map(AddrText::as_str),
            Source::Route => Some(facts.path),
            Source::Method => Some(facts.method),
            Source::Header(h) => header_text(facts.headers, &self.headers.get(h)?.0),
        }
    }
}

/// The client address's text (through `client_ip`'s trusted proxies), if it can be found.
#[inline]
fn client_text(client_ip: Option<&ClientIp>, facts: &RequestFacts<'_>) -> Option<AddrText> {
    client_ip?
        .client_addr(facts.peer?, facts.headers)
        .ok()
        .and_then(AddrText::of)
}

/// A header's first value as text, if present, non-empty and visible ASCII.
fn header_text<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h str> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .filter(|value| !value.is_empty())
}

/// Calls `f` with the descriptors of `facts` under `names` (the client address through
/// `client_ip`), built on the stack: every policy edge builds them this way.
pub(crate) fn with_descriptors<R>(
    names: &DescriptorNames,
    client_ip: Option<&ClientIp>,
    facts: &RequestFacts<'_>,
    f: impl FnOnce(&[(&str, &str)]) -> R,
) -> R {
    {
        let client = match names.client {
            Some(_) => client_text(client_ip, facts),
            None => None,
        };
        let fixed = [
            (
                names.client.as_deref(),
                client.as_ref().map(AddrText::as_str),
            ),
            (names.route.as_deref(), Some(facts.path)),
            (names.method.as_deref(), Some(facts.method)),
        ];
        let headers = names
            .headers
            .iter()
            .map(|(header, name)| (Some(&**name), header_text(facts.headers, header)));
        let mut descriptors: [(&str, &str); MAX_DESCRIPTORS] = [("", ""); MAX_DESCRIPTORS];
        let mut len = 0;
        for pair in fixed.into_iter().chain(headers) {
            if let (Some(name), Some(value), Some(slot)) =
                (pair.0, pair.1, descriptors.get_mut(len))
            {
                *slot = (name, value);
                len += 1;
            }
        }
        f(&descriptors[..len])
    }
}
