//! What every Hetzner Cloud resource of the fake shares, as the API reference's "Labels", "Label
//! Selector" and "Pagination" describe it.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// Hetzner's label rules ("Labels"): keys an optional DNS-subdomain prefix and `/`, then a name
/// of at most 63 characters; values at most 63; both alphanumeric at the ends with `-_.` inside
/// (a value may be empty).
pub fn label_ok(key: &str, value: &str) -> bool {
    let part = |s: &str, empty: bool| {
        (s.is_empty() && empty)
            || (s.len() <= 63
                && s.starts_with(|c: char| c.is_ascii_alphanumeric())
                && s.ends_with(|c: char| c.is_ascii_alphanumeric())
                && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)))
    };
    let (prefix, name) = key.rsplit_once('/').unwrap_or(("", key));
    let prefix_ok = prefix.is_empty() || (prefix.len() <= 253 && prefix.split('.').all(|p| part(p, false)));
    prefix_ok && part(name, false) && part(value, true)
}

/// The `labels` of a create body, or `None` when one breaks the rules ([`label_ok`]).
pub fn labels_in(body: &Value) -> Option<BTreeMap<String, String>> {
    let labels: BTreeMap<String, String> = body["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("\u{0}").to_string()))
        .collect();
    labels.iter().all(|(k, v)| label_ok(k, v)).then_some(labels)
}

/// Whether `labels` match a `label_selector` (`k==v`, `k=v`, or `k`); none selects all.
pub fn selected(labels: &BTreeMap<String, String>, query: &BTreeMap<String, String>) -> bool {
    let selector = query.get("label_selector").map(String::as_str).unwrap_or_default();
    match selector.split_once("==").or_else(|| selector.split_once('=')) {
        Some((k, v)) => labels.get(k).map(String::as_str) == Some(v),
        None => selector.is_empty() || labels.contains_key(selector),
    }
}

/// A list answer: the page of `matching` that `page` and `per_page` (25 by default) ask for,
/// under `key`, with `meta.pagination`.
pub fn paged(key: &str, matching: Vec<Value>, query: &BTreeMap<String, String>) -> (u16, Value) {
    let per_page: usize = query.get("per_page").and_then(|p| p.parse().ok()).unwrap_or(25).max(1);
    let page: usize = query.get("page").and_then(|p| p.parse().ok()).unwrap_or(1).max(1);
    let last = matching.len().div_ceil(per_page).max(1);
    let items: Vec<Value> = matching.iter().skip((page - 1) * per_page).take(per_page).cloned().collect();
    let some = |cond: bool, p: usize| if cond { json!(p) } else { Value::Null };
    let pagination = json!({"page": page, "per_page": per_page,
        "previous_page": some(page > 1, page.saturating_sub(1)), "next_page": some(page < last, page + 1),
        "last_page": last, "total_entries": matching.len()});
    (200, json!({key: items, "meta": {"pagination": pagination}}))
}
