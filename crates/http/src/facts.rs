//! [`RequestFacts`]: the request as every policy edge sees it, before anything is decided; below
//! the [`edge`](crate::edge) that decides it and the [`explain`](crate::explain) option that
//! trusts it.

use std::net::IpAddr;

use http::HeaderMap;

use crate::key::RequestHead;

/// What an edge knows about a request before deciding it, independent of its transport.
#[derive(Clone, Copy, Debug)]
pub struct RequestFacts<'a> {
    /// The TCP peer (`None` when the transport does not say).
    pub peer: Option<IpAddr>,
    /// The method.
    pub method: &'a str,
    /// The path (no query).
    pub path: &'a str,
    /// The header fields.
    pub headers: &'a HeaderMap,
}

impl<'a> RequestFacts<'a> {
    /// The facts of a tower/hyper request head (its peer from the extensions, as
    /// [`RequestHead::peer_addr`] finds it).
    pub fn of(head: &RequestHead<'a>) -> Self {
        RequestFacts {
            peer: head.peer_addr().map(|a| a.ip()),
            method: head.method.as_str(),
            path: head.uri.path(),
            headers: head.headers,
        }
    }
}
