//! `TagMap`: a Queue's user tags, stored as a sorted vector instead of a `BTreeMap`.
//!
//! Every Queue sits in the controller's cache for its whole life. A `BTreeMap` with one entry
//! allocates a whole eleven-slot leaf (544 bytes, jemalloc's 640-byte class); a vector of the
//! same entries allocates 48 bytes per tag, and keys and values of up to 24 bytes live inside
//! it (`CompactString`). The API is the same: a JSON object of strings, the same schema,
//! iteration sorted by key.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use compact_str::CompactString;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// String keys to string values, sorted by key, each key once.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TagMap(Vec<(CompactString, CompactString)>);

impl TagMap {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        let i = self.0.binary_search_by(|(k, _)| k.as_str().cmp(key)).ok()?;
        Some(&self.0[i].1)
    }

    /// Entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// Like `BTreeMap`: sorted by key, a later value for the same key wins.
impl FromIterator<(String, String)> for TagMap {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(entries: I) -> Self {
        entries.into_iter().map(|(k, v)| (CompactString::from(k), CompactString::from(v))).collect()
    }
}

impl FromIterator<(CompactString, CompactString)> for TagMap {
    fn from_iter<I: IntoIterator<Item = (CompactString, CompactString)>>(entries: I) -> Self {
        let mut all: Vec<(CompactString, CompactString)> = entries.into_iter().collect();
        // Stable, so equal keys keep their order and the last of them is the one kept.
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(CompactString, CompactString)> = Vec::with_capacity(all.len());
        for entry in all {
            match out.last_mut() {
                Some(last) if last.0 == entry.0 => *last = entry,
                _ => out.push(entry),
            }
        }
        out.shrink_to_fit();
        TagMap(out)
    }
}

impl<const N: usize> From<[(String, String); N]> for TagMap {
    fn from(entries: [(String, String); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl From<TagMap> for BTreeMap<String, String> {
    fn from(tags: TagMap) -> Self {
        tags.0.into_iter().map(|(k, v)| (k.into_string(), v.into_string())).collect()
    }
}

impl Serialize for TagMap {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k.as_str(), v.as_str())?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for TagMap {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = TagMap;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of strings to strings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<TagMap, A::Error> {
                let mut entries = Vec::with_capacity(access.size_hint().unwrap_or(0).min(64));
                while let Some(entry) = access.next_entry::<CompactString, CompactString>()? {
                    entries.push(entry);
                }
                Ok(entries.into_iter().collect())
            }
        }
        deserializer.deserialize_map(Entries)
    }
}

/// The schema of `BTreeMap<String, String>`, so the CRD does not change.
impl JsonSchema for TagMap {
    fn inline_schema() -> bool {
        <BTreeMap<String, String>>::inline_schema()
    }

    fn schema_name() -> Cow<'static, str> {
        <BTreeMap<String, String>>::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        <BTreeMap<String, String>>::schema_id()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        <BTreeMap<String, String>>::json_schema(generator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(k: &str, v: &str) -> (String, String) {
        (k.to_string(), v.to_string())
    }

    #[test]
    fn reads_and_writes_the_json_a_btreemap_does() {
        let json = r#"{"team":"shop","env":"prod","cost-center":"42"}"#;
        let tags: TagMap = serde_json::from_str(json).unwrap();
        let map: BTreeMap<String, String> = serde_json::from_str(json).unwrap();
        assert_eq!(serde_json::to_string(&tags).unwrap(), serde_json::to_string(&map).unwrap());
        assert_eq!(tags.get("env"), Some("prod"));
        assert_eq!(tags.get("missing"), None);
        assert_eq!(tags.iter().map(|(k, _)| k).collect::<Vec<_>>(), ["cost-center", "env", "team"]);
        assert_eq!(BTreeMap::from(tags), map);
        assert!(serde_json::from_str::<TagMap>(r#"{"a":1}"#).is_err());
        assert!(serde_json::from_str::<TagMap>("{}").unwrap().is_empty());
    }

    #[test]
    fn a_later_value_for_a_key_wins_as_in_a_btreemap() {
        let tags: TagMap = [pair("b", "1"), pair("a", "x"), pair("b", "2")].into();
        let map: BTreeMap<String, String> = [pair("b", "1"), pair("a", "x"), pair("b", "2")].into();
        assert_eq!(tags.len(), 2);
        assert_eq!(BTreeMap::from(tags), map);
    }

    #[test]
    fn the_schema_is_a_btreemaps() {
        let ours = schemars::schema_for!(TagMap);
        let theirs = schemars::schema_for!(BTreeMap<String, String>);
        assert_eq!(serde_json::to_value(ours).unwrap(), serde_json::to_value(theirs).unwrap());
    }
}
