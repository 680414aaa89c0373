//! Canonical tags in each cloud's own syntax, both ways:
//! - Hetzner Cloud labels are key/value pairs with Kubernetes-like rules: keys pass unchanged,
//!   values are at most 63 characters (longer ones are shortened, see [`fit_value`]).
//! - DigitalOcean tags are single strings of `[a-zA-Z0-9_:-]`, at most 255 characters: `key=value`
//!   becomes `skyport_dev:tunnel-uid:<value>` with `.` written as `_` (Kubernetes names never
//!   contain `_`, so the mapping reverses exactly).

/// The canonical prefix of skyport's tag keys.
const KEY_PREFIX: &str = "skyport.dev/";
/// How that prefix is spelled inside a DigitalOcean tag.
const DO_KEY_PREFIX: &str = "skyport_dev:";

/// A cloud's tag syntax, for mapping canonical `key=value` tags both ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagSyntax {
    /// Plain strings of `[a-zA-Z0-9_:-]`, at most 255 characters (DigitalOcean tags).
    DigitalOcean,
    /// Key/value labels, values at most 63 characters of `[a-zA-Z0-9_.-]` (Hetzner Cloud).
    Hetzner,
}

/// DigitalOcean's maximum tag length.
pub const DO_TAG_MAX: usize = 255;
/// Hetzner Cloud's maximum label value length.
pub const HETZNER_VALUE_MAX: usize = 63;

impl TagSyntax {
    /// One canonical tag in this cloud's syntax: `(key, value)` for Hetzner; for DigitalOcean the
    /// whole tag string is returned as the key and the value is empty.
    pub fn encode(self, key: &str, value: &str) -> (String, String) {
        match self {
            TagSyntax::Hetzner => (key.to_string(), fit_value(&sanitize(value, "-_."), HETZNER_VALUE_MAX)),
            TagSyntax::DigitalOcean => {
                let key = match key.strip_prefix(KEY_PREFIX) {
                    Some(rest) => format!("{DO_KEY_PREFIX}{}", sanitize(rest, "-")),
                    None => sanitize(key, "-_:"),
                };
                let value = sanitize(&value.replace('.', "_"), "-_");
                let room = DO_TAG_MAX.saturating_sub(key.len() + 1);
                (format!("{key}:{}", fit_value(&value, room)), String::new())
            }
        }
    }

    /// Reads a provider tag back into canonical form (the inverse of [`TagSyntax::encode`] for
    /// values that fitted).
    pub fn decode(self, key: &str, value: &str) -> (String, String) {
        match self {
            TagSyntax::Hetzner => (key.to_string(), value.to_string()),
            TagSyntax::DigitalOcean => match key.strip_prefix(DO_KEY_PREFIX).and_then(|rest| rest.split_once(':')) {
                Some((name, value)) => (format!("{KEY_PREFIX}{name}"), value.replace('_', ".")),
                None => (key.to_string(), value.to_string()),
            },
        }
    }
}

/// Replaces every character outside `[a-zA-Z0-9]` and `extra` with `-`.
fn sanitize(s: &str, extra: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || extra.contains(c) { c } else { '-' }).collect()
}

/// `value` if it fits in `max` characters, else a prefix plus `-` plus 8 hex digits of a hash of
/// the whole value, so distinct long values stay distinct and the same value always maps the
/// same way (list-by-tag encodes the query value with the same function).
pub fn fit_value(value: &str, max: usize) -> String {
    if value.len() <= max {
        return value.to_string();
    }
    let suffix = format!("-{:08x}", fnv1a32(value.as_bytes()));
    let keep = max.saturating_sub(suffix.len());
    let mut head: String = value.chars().take(keep).collect();
    // Label values must begin and end with an alphanumeric; the hash ends with one, the head
    // must not end in a separator before the dash.
    while head.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        head.pop();
    }
    format!("{head}{suffix}")
}

/// 32-bit FNV-1a: a stable, dependency-free hash for shortening names (not for security).
pub(crate) fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193))
}
