//! Limits from configuration (feature `serde`): a whole limiter read from
//! TOML, YAML, JSON or the environment, checked as it is read, and built
//! into a [`RateLimitLayer`].
//!
//! ```
//! use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
//! use tower::ServiceExt;
//! use tower_pinned_window::config::{LimiterConfig, Tier};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // TOML (with the `toml` crate), YAML or the environment work the same way.
//! let config: LimiterConfig = serde_json::from_str(r#"{
//!     "name": "api",
//!     "quota": "2/min",
//!     "key": { "header": "x-api-key" },
//!     "also": ["10000/1d"],
//!     "routes": { "/login": { "name": "login", "quota": "5 per 15m" } },
//!     "tiers": { "pro": "1000/min" }
//! }"#).unwrap();
//!
//! let app = Router::new().route("/", get(|| async { "hello" })).layer(config.layer());
//! let request = |tier: Option<&str>| {
//!     let mut request = Request::builder().header("x-api-key", "k1").body(Body::empty()).unwrap();
//!     if let Some(tier) = tier {
//!         // Set by your authentication, never read from the client.
//!         request.extensions_mut().insert(Tier::new(tier));
//!     }
//!     request
//! };
//! assert_eq!(app.clone().oneshot(request(None)).await.unwrap().status(), StatusCode::OK);
//! assert_eq!(app.clone().oneshot(request(None)).await.unwrap().status(), StatusCode::OK);
//! assert_eq!(app.clone().oneshot(request(None)).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
//! let pro = app.oneshot(request(Some("pro"))).await.unwrap();
//! assert_eq!(pro.status(), StatusCode::OK);
//! // Upgraded, the key keeps its count (3, the denial counted): 996 left.
//! assert_eq!(pro.headers()["ratelimit"], "\"pro\";r=996;t=60");
//! # }
//! ```
//!
//! # The format
//!
//! Field names are kebab-case; every field but `name` and `quota` is
//! optional, and an unknown field is an error (a misspelt `per-route` is
//! never silently ignored).
//!
//! | field | default | value |
//! |---|---|---|
//! | `name` | | the layer's name: 1–32 of `A-Z a-z 0-9 _ - . :` |
//! | `quota` | | a rate string, `"100/min"` (grammar in [`Quota`](crate::Quota#rate-strings)) |
//! | `key` | `"global"` | see below |
//! | `per-route` | `false` | key by the route too: each client its own budget per route |
//! | `also` | none | more quotas checked on every request: rate strings, or `{ name = "daily", quota = "10000/1d" }` |
//! | `routes` | none | a table of axum routes (`"/users/{id}"`) or gRPC methods (`"/auth.Auth/Login"`) to their quota, a rate string or `{ name, quota }` |
//! | `tiers` | none | a table of tier names to their quota; a request's tier is the [`Tier`] in its extensions |
//! | `shadow` | `false` | count and set headers, never deny |
//! | `on-failure` | `"fail-closed"` | or `"fail-open"`, or `"insurance 1/4"` for [`FailurePolicy::Insurance`] at that [`Share`](crate::Share) (see [`FailurePolicy`]) |
//! | `on-missing-key` | `"reject"` | or `"allow"` (see [`allow_missing_key`](crate::RateLimitLayer::allow_missing_key)) |
//! | `headers` | `"ietf"` | or `"legacy"`, `"none"` (see [`HeaderStyle`]) |
//!
//! The `key` is one of:
//!
//! ```toml
//! key = "global"                      # one budget for everyone
//! key = "peer-ip"                     # the connection's peer address (a client-ip that trusts no proxy)
//! key = { peer-ip = { ipv6-prefix = 56 } }
//! key = "client-ip"                   # the client address through trusted proxies:
//! key = { client-ip = { trust = ["10.0.0.0/8", "loopback", "private"], header = "x-forwarded-for", ipv6-prefix = 64, max-hops = 16 } }
//! key = { header = "x-api-key" }      # a header's value
//! key = "route"                       # the matched route or gRPC method
//! ```
//!
//! `trust` takes CIDRs, addresses, and the presets `"loopback"` and
//! `"private"`; `header` is `"x-forwarded-for"` (the default),
//! `"forwarded"` or `"x-real-ip"`: the one **your proxy** sets (see
//! [`ClientIp::header`]; a name outside these three, such as a CDN's, is
//! set in code, where a typo is yours to see).
//!
//! # Tiers come from the server, never from the client
//!
//! A request's tier is the [`Tier`] value in its extensions, which only
//! server code can set: your authentication middleware, once it knows who
//! is calling, inserts `Tier::new("pro")`. A tier read from a header the
//! client sends would let any client name its own quota. A request with no
//! `Tier`, or one the configuration does not list, gets its route's quota
//! or the layer's. A tier's quota is named as the tier in the headers,
//! unless it is given as `{ name, quota }`.
//!
//! # Errors
//!
//! Everything is checked while the configuration is read, so a
//! [`LimiterConfig`] always builds: a bad rate (`"0/min"`), name, CIDR,
//! header name, IPv6 prefix, hop count or policy name is a deserialisation
//! error that names the value and what was wrong, and a TOML parser adds
//! the line.
//!
//! # From the environment
//!
//! A single limit is one variable: `"100/min".parse::<Quota>()` (what
//! `examples/quickstart.rs` does with `RATE_LIMIT`). A whole configuration
//! comes through any serde source that maps variables to fields, such as
//! the `figment` or `config` crates (`APP_LIMITER__QUOTA=100/min`), or as
//! one variable holding TOML or JSON.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use crate::budget::failure::FailurePolicy;
use crate::core::OnMissingKey;
use crate::error::ConfigError;
use crate::key::{ClientIp, Key, KeyError, KeyExtractor, RouteKey};
use crate::name::is_layer_name;
use crate::policy::NamedQuota;
use crate::quota::Quota;
use crate::request::RequestHead;
use crate::response::HeaderStyle;
use crate::server::layer::RateLimitLayer;

/// One limiter, as configuration describes it; see the
/// [module docs](self) for the format. Deserialising checks every value,
/// so [`layer`](Self::layer) cannot fail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct LimiterConfig {
    name: Name,
    quota: Quota,
    #[serde(default)]
    key: KeyConfig,
    #[serde(default)]
    per_route: bool,
    #[serde(default)]
    also: Vec<NamedQuota>,
    #[serde(default)]
    routes: BTreeMap<String, NamedQuota>,
    #[serde(default, with = "tiers")]
    tiers: BTreeMap<String, NamedQuota>,
    #[serde(default)]
    shadow: bool,
    #[serde(default, with = "failure_policy")]
    on_failure: FailurePolicy,
    #[serde(default, with = "on_missing_key")]
    on_missing_key: OnMissingKey,
    #[serde(default, with = "header_style")]
    headers: HeaderStyle,
}

impl LimiterConfig {
    /// The layer's name.
    ///
    /// ```
    /// use tower_pinned_window::Quota;
    /// use tower_pinned_window::config::LimiterConfig;
    ///
    /// let json = r#"{ "name": "api", "quota": "100/min", "key": { "header": "X-Api-Key" } }"#;
    /// let config: LimiterConfig = serde_json::from_str(json).unwrap();
    /// assert_eq!(config.name(), "api");
    /// assert_eq!(config.quota(), "100/min".parse::<Quota>().unwrap());
    ///
    /// // Every value is checked as it is read: a header name with a space is refused.
    /// let json = r#"{ "name": "api", "quota": "100/min", "key": { "header": "x api key" } }"#;
    /// let err = serde_json::from_str::<LimiterConfig>(json).unwrap_err();
    /// assert!(err.to_string().contains("\"x api key\" is not a valid HTTP header name"), "{err}");
    /// ```
    pub fn name(&self) -> &str {
        &self.name.0
    }

    /// The layer's quota (example: [`name`](Self::name)).
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// The layer this configuration describes, on a fresh
    /// [`MemoryBackend`](crate::backend::MemoryBackend). Chain what
    /// configuration does not hold: `.backend(redis)`, `.timeout(..)`,
    /// `.deny_with(..)`, `.on_decision(..)`. Its key extractor is the
    /// configuration's (one of the built-in extractors, joined with the
    /// route when `per-route` is set), a type of its own that is never
    /// named.
    pub fn layer(
        &self,
    ) -> RateLimitLayer<impl KeyExtractor + Clone + Send + Sync + fmt::Debug + 'static> {
        let mut layer = RateLimitLayer::try_new(self.name.0.as_str(), self.quota)
            .expect("the name was checked when the configuration was read")
            .key(ConfigKey {
                kind: self.key.kind.clone(),
                per_route: self.per_route,
            })
            .shadow(self.shadow)
            .on_failure(self.on_failure)
            .allow_missing_key(self.on_missing_key == OnMissingKey::Allow)
            .headers(self.headers);
        for quota in &self.also {
            layer = layer.also(quota.clone());
        }
        for (route, quota) in &self.routes {
            layer = layer.route_quota(route, quota.clone());
        }
        if !self.tiers.is_empty() {
            let tiers: HashMap<Box<str>, NamedQuota> = self
                .tiers
                .iter()
                .map(|(tier, quota)| (tier.as_str().into(), quota.clone()))
                .collect();
            layer = layer.quota_by(move |request| {
                let tier = request.extensions().get::<Tier>()?;
                tiers.get(tier.as_str()).cloned()
            });
        }
        layer
    }
}

/// A request's tier, for a layer built from a [`LimiterConfig`] with
/// `tiers`: put it in the request's extensions **in your authentication
/// code**, once you know who is calling. Never build it from a client
/// header: the client would pick its own quota.
///
/// ```
/// use tower_pinned_window::config::Tier;
///
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(Tier::new("pro"));
/// assert_eq!(request.extensions().get::<Tier>().unwrap().as_str(), "pro");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tier(Arc<str>);

impl Tier {
    /// The tier named `name`, as the configuration's `tiers` table names it
    /// (example: [`Tier`]).
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self(name.into())
    }

    /// The tier's name (example: [`Tier`]).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The key extractor of a layer built from a [`LimiterConfig`]: one of the
/// built-in extractors, joined with the route when `per-route` is set.
#[derive(Debug, Clone)]
struct ConfigKey {
    kind: KeyKind,
    per_route: bool,
}

impl KeyExtractor for ConfigKey {
    fn extract(&self, request: &RequestHead<'_>) -> Result<Key, KeyError> {
        let key = match &self.kind {
            KeyKind::Global => ().extract(request),
            KeyKind::ClientIp(client) => client.extract(request),
            KeyKind::Header(header) => header.extract(request),
            KeyKind::Route => RouteKey.extract(request),
        }?;
        if !self.per_route {
            return Ok(key);
        }
        // As the pair `(key, RouteKey)` joins them.
        Ok(Key::join(&key, &RouteKey.extract(request)?))
    }
}

/// A built extractor.
#[derive(Debug, Clone)]
enum KeyKind {
    Global,
    ClientIp(ClientIp),
    Header(HeaderName),
    Route,
}

/// A layer name, checked as it is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
struct Name(String);

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        if !is_layer_name(&name) {
            return Err(de::Error::custom(ConfigError::InvalidName(name)));
        }
        Ok(Self(name))
    }
}

/// The `key` field: what it says, and the extractor built from it.
#[derive(Debug, Clone)]
struct KeyConfig {
    spec: KeySpec,
    kind: KeyKind,
}

impl PartialEq for KeyConfig {
    fn eq(&self, other: &Self) -> bool {
        self.spec == other.spec
    }
}

impl Eq for KeyConfig {}

impl Default for KeyConfig {
    fn default() -> Self {
        Self {
            spec: KeySpec::Global,
            kind: KeyKind::Global,
        }
    }
}

/// The `key` field as written.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeySpec {
    Global,
    PeerIp(PeerIpSpec),
    ClientIp(ClientIpSpec),
    Header(String),
    Route,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct PeerIpSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ipv6_prefix: Option<u8>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct ClientIpSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    trust: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    header: Option<ForwardedSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ipv6_prefix: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_hops: Option<usize>,
}

/// The headers a configuration may name: a closed list, so that a typo is
/// refused when the file is read rather than trusted as a header of one
/// address that never comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum ForwardedSpec {
    XForwardedFor,
    Forwarded,
    XRealIp,
}

impl KeySpec {
    /// The extractor, or what is wrong with the configuration.
    fn build(&self) -> Result<KeyKind, ConfigError> {
        Ok(match self {
            Self::Global => KeyKind::Global,
            Self::Route => KeyKind::Route,
            Self::PeerIp(spec) => {
                // The peer: a client address that trusts no proxy.
                let mut peer = ClientIp::new();
                if let Some(bits) = spec.ipv6_prefix {
                    peer = peer.try_ipv6_prefix(bits)?;
                }
                KeyKind::ClientIp(peer)
            }
            Self::ClientIp(spec) => {
                let mut client = ClientIp::new();
                for trusted in &spec.trust {
                    client = match trusted.as_str() {
                        "loopback" => client.trust_loopback(),
                        "private" => client.trust_private(),
                        cidr => client.trust(cidr)?,
                    };
                }
                if let Some(header) = spec.header {
                    client = client.header(HeaderName::from_static(match header {
                        ForwardedSpec::XForwardedFor => "x-forwarded-for",
                        ForwardedSpec::Forwarded => "forwarded",
                        ForwardedSpec::XRealIp => "x-real-ip",
                    }));
                }
                if let Some(bits) = spec.ipv6_prefix {
                    client = client.try_ipv6_prefix(bits)?;
                }
                if let Some(hops) = spec.max_hops {
                    client = client.try_max_hops(hops)?;
                }
                KeyKind::ClientIp(client)
            }
            Self::Header(name) => KeyKind::Header(
                HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| ConfigError::InvalidHeaderName(name.clone()))?,
            ),
        })
    }
}

const KEY_KINDS: &[&str] = &["global", "peer-ip", "client-ip", "header", "route"];

impl<'de> Deserialize<'de> for KeyConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;

        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = KeySpec;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a key: \"global\", \"peer-ip\", \"client-ip\", \"route\", or a table such as { header = \"x-api-key\" } or { client-ip = { trust = [\"10.0.0.0/8\"] } }",
                )
            }

            fn visit_str<E: de::Error>(self, kind: &str) -> Result<KeySpec, E> {
                match kind {
                    "global" => Ok(KeySpec::Global),
                    "peer-ip" => Ok(KeySpec::PeerIp(PeerIpSpec::default())),
                    "client-ip" => Ok(KeySpec::ClientIp(ClientIpSpec::default())),
                    "route" => Ok(KeySpec::Route),
                    "header" => Err(E::custom(
                        "the header key needs the header's name: key = { header = \"x-api-key\" }",
                    )),
                    other => Err(E::unknown_variant(other, KEY_KINDS)),
                }
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KeySpec, A::Error> {
                let Some(kind) = map.next_key::<String>()? else {
                    return Err(de::Error::invalid_length(0, &self));
                };
                let spec = match kind.as_str() {
                    "peer-ip" => KeySpec::PeerIp(map.next_value()?),
                    "client-ip" => KeySpec::ClientIp(map.next_value()?),
                    "header" => KeySpec::Header(map.next_value()?),
                    "global" | "route" => {
                        return Err(de::Error::custom(format_args!(
                            "the {kind:?} key takes no options: write key = {kind:?}"
                        )));
                    }
                    other => return Err(de::Error::unknown_variant(other, KEY_KINDS)),
                };
                if map.next_key::<IgnoredAny>()?.is_some() {
                    return Err(de::Error::custom(
                        "a key table names one kind, such as { header = \"x-api-key\" }",
                    ));
                }
                Ok(spec)
            }
        }

        let spec = deserializer.deserialize_any(KeyVisitor)?;
        let kind = spec.build().map_err(de::Error::custom)?;
        Ok(Self { spec, kind })
    }
}

impl Serialize for KeyConfig {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.spec {
            KeySpec::Global => serializer.serialize_str("global"),
            KeySpec::Route => serializer.serialize_str("route"),
            KeySpec::PeerIp(spec) if *spec == PeerIpSpec::default() => {
                serializer.serialize_str("peer-ip")
            }
            KeySpec::ClientIp(spec) if *spec == ClientIpSpec::default() => {
                serializer.serialize_str("client-ip")
            }
            KeySpec::PeerIp(spec) => one_entry(serializer, "peer-ip", spec),
            KeySpec::ClientIp(spec) => one_entry(serializer, "client-ip", spec),
            KeySpec::Header(name) => one_entry(serializer, "header", name),
        }
    }
}

fn one_entry<S: Serializer, V: Serialize + ?Sized>(
    serializer: S,
    key: &str,
    value: &V,
) -> Result<S::Ok, S::Error> {
    let mut map = serializer.serialize_map(Some(1))?;
    map.serialize_entry(key, value)?;
    map.end()
}

/// A rate string, `"100/min"`.
impl Serialize for Quota {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// From a rate string, `"100/min"` or `"5 per 15m"`; a bad one is an error
/// that names it and what was wrong.
impl<'de> Deserialize<'de> for Quota {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RateVisitor;

        impl Visitor<'_> for RateVisitor {
            type Value = Quota;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a rate string such as \"100/min\" or \"5 per 15m\"")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Quota, E> {
                text.parse().map_err(E::custom)
            }
        }

        deserializer.deserialize_str(RateVisitor)
    }
}

/// A plain quota as its rate string; a named one as `{ name, quota }`.
impl Serialize for NamedQuota {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.name() {
            None => self.quota().serialize(serializer),
            Some(name) => {
                let mut map = serializer.serialize_map(Some(2))?;
                map.serialize_entry("name", name)?;
                map.serialize_entry("quota", &self.quota())?;
                map.end()
            }
        }
    }
}

/// From a rate string (a quota the layer names) or `{ name, quota }` (the
/// name optional).
impl<'de> Deserialize<'de> for NamedQuota {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Named {
            name: Option<String>,
            quota: Quota,
        }

        struct NamedVisitor;

        impl<'de> Visitor<'de> for NamedVisitor {
            type Value = NamedQuota;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a rate string such as \"100/min\", or { name = \"login\", quota = \"5/15m\" }",
                )
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<NamedQuota, E> {
                text.parse::<Quota>().map(Into::into).map_err(E::custom)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<NamedQuota, A::Error> {
                let named = Named::deserialize(de::value::MapAccessDeserializer::new(map))?;
                match named.name {
                    Some(name) => NamedQuota::try_new(name, named.quota).map_err(de::Error::custom),
                    None => Ok(named.quota.into()),
                }
            }
        }

        deserializer.deserialize_any(NamedVisitor)
    }
}

/// `tiers`: a quota without a name of its own is named as its tier.
mod tiers {
    use super::*;

    pub(super) fn serialize<S: Serializer>(
        tiers: &BTreeMap<String, NamedQuota>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(tiers.len()))?;
        for (tier, quota) in tiers {
            if quota.name() == Some(tier.as_str()) {
                map.serialize_entry(tier, &quota.quota())?;
            } else {
                map.serialize_entry(tier, quota)?;
            }
        }
        map.end()
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<String, NamedQuota>, D::Error> {
        BTreeMap::<String, NamedQuota>::deserialize(deserializer)?
            .into_iter()
            .map(|(tier, quota)| {
                let quota = match quota.name() {
                    Some(_) => quota,
                    None => NamedQuota::try_new(tier.clone(), quota.quota())
                        .map_err(de::Error::custom)?,
                };
                Ok((tier, quota))
            })
            .collect()
    }
}

/// A unit enum of the crate as a kebab-case string.
macro_rules! string_enum {
    ($module:ident, $ty:ty, $what:literal, { $($variant:path => $text:literal),+ $(,)? }) => {
        mod $module {
            use super::*;

            const NAMES: &[&str] = &[$($text),+];

            pub(super) fn serialize<S: Serializer>(value: &$ty, serializer: S) -> Result<S::Ok, S::Error> {
                #[allow(unreachable_patterns)]
                let text = match value {
                    $($variant => $text,)+
                    _ => return Err(serde::ser::Error::custom(concat!("a ", $what, " this version cannot write"))),
                };
                serializer.serialize_str(text)
            }

            pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<$ty, D::Error> {
                let text = String::deserialize(deserializer)?;
                match text.as_str() {
                    $($text => Ok($variant),)+
                    other => Err(de::Error::unknown_variant(other, NAMES)),
                }
            }
        }
    };
}

/// `"fail-closed"`, `"fail-open"`, or `"insurance N/D"`.
mod failure_policy {
    use super::*;
    use crate::quota::Share;

    pub(super) fn serialize<S: Serializer>(
        value: &FailurePolicy,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        #[allow(unreachable_patterns)]
        match value {
            FailurePolicy::FailClosed => serializer.serialize_str("fail-closed"),
            FailurePolicy::FailOpen => serializer.serialize_str("fail-open"),
            FailurePolicy::Insurance(share) => {
                serializer.serialize_str(&format!("insurance {share}"))
            }
            _ => Err(serde::ser::Error::custom(
                "a failure policy this version cannot write",
            )),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<FailurePolicy, D::Error> {
        let text = String::deserialize(deserializer)?;
        match text.as_str() {
            "fail-closed" => Ok(FailurePolicy::FailClosed),
            "fail-open" => Ok(FailurePolicy::FailOpen),
            other => match other.strip_prefix("insurance ") {
                Some(share) => share
                    .parse::<Share>()
                    .map(FailurePolicy::Insurance)
                    .map_err(de::Error::custom),
                None => Err(de::Error::invalid_value(
                    de::Unexpected::Str(other),
                    &"\"fail-closed\", \"fail-open\" or \"insurance N/D\" (such as \"insurance 1/4\")",
                )),
            },
        }
    }
}

string_enum!(on_missing_key, OnMissingKey, "missing-key policy", {
    OnMissingKey::Reject => "reject",
    OnMissingKey::Allow => "allow",
});

string_enum!(header_style, HeaderStyle, "header style", {
    HeaderStyle::Ietf => "ietf",
    HeaderStyle::Legacy => "legacy",
    HeaderStyle::None => "none",
});
